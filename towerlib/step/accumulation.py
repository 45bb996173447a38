"""Gradient accumulation: one optimizer step over k micro-batches per tower.

With ``accumulation_steps=k`` the global batch of B examples is split k ways
(the first B mod k micro-batches get one example more), each micro-batch
over the towers as usual, and the towers are built once per micro-batch
(sharing the variables). Micro-batch j's tower i weights its mean loss by
n_ji / B, so the summed gradient is exactly one device's gradient on the
whole global batch; the regularization is added once (micro-batch 0, tower
0). One apply follows, adding 1 to global_step: one train op per optimizer
step, so run_training, hooks, checkpoints and learning-rate schedules see
nothing new, and a checkpoint never holds half an accumulated step.

Memory: micro-batch j + 1's inputs wait (control dependencies) for every
gradient of micro-batch j, so the micro-batches run one after the other
and the activations of one are freed before the next starts: the peak
activation memory is that of one micro-batch. The wait is a chain of
gates (`after`), one NoOp per micro-batch after the first: it waits for the
previous micro-batch's gradients and the previous gate, and the
micro-batch's inputs wait for it, so the control edges grow linearly with
k (not as k^2, every input waiting for every earlier gradient). The accumulated gradients
(one model's worth per micro-batch until the sum) stay float32 on the
variables' devices (parameter server) or the towers' (replicated).

For example B = 10, k = 2 and 2 towers give micro-batches of 5 and 5 and
shards of 3 + 2 in each; the four tower losses are weighted 0.3, 0.2, 0.3 and
0.2.

With an input function, ``input_fn(ctx)`` is called once per tower and
micro-batch (``ctx.micro_batch`` says which), and B is the sum of what they
return.
"""

import contextlib
import dataclasses
import numbers
import weakref

import tensorflow as tf

from towerlib.checks import run_time
from towerlib.step import inputs as inputs_lib
from towerlib.step.context import TowerContext

__all__ = ["after", "check_accumulation_steps", "check_batch_covers_micro_batches",
           "micro_batch_scope", "micro_batches"]


def check_accumulation_steps(accumulation_steps):
    """Refuses anything but an int >= 1; returns it."""
    if (isinstance(accumulation_steps, bool)
            or not isinstance(accumulation_steps, numbers.Integral)
            or accumulation_steps < 1):
        raise ValueError(
            f"accumulation_steps must be an int >= 1 (1: no accumulation), got "
            f"{accumulation_steps!r}. Fix: e.g. accumulation_steps=4.")
    return int(accumulation_steps)


def check_batch_covers_micro_batches(global_batch, accumulation_steps, num_towers):
    """Refuses a global batch that cannot give every tower of every micro-batch an example."""
    needed = accumulation_steps * num_towers
    if global_batch < needed:
        raise ValueError(
            f"The global batch has {global_batch} examples, fewer than "
            f"accumulation_steps x towers = {accumulation_steps} x {num_towers} = "
            f"{needed}, so some tower would get no example in some micro-batch. Use "
            f"a global batch of at least {needed}, or fewer micro-batches or towers.")


def micro_batch_scope(micro_batch, accumulation_steps):
    """The name scope of one micro-batch's towers (none without accumulation)."""
    if accumulation_steps == 1:
        return contextlib.nullcontext()
    return tf.name_scope(f"micro_batch_{micro_batch}")


def micro_batches(inputs, accumulation_steps, devices, bn_mode, host_device):
    """(the k micro-batches' inputs, B as a float32 scalar or None when k = 1).

    Each entry is what build_towers takes as `inputs`: a nest of tensors (the
    micro-batch, split over the towers there), or an input function.
    """
    if accumulation_steps == 1:
        return [inputs], None
    num_towers = len(devices)
    if callable(inputs):
        return _prebuilt_inputs(inputs, accumulation_steps, devices, bn_mode, host_device)
    static_batch = inputs_lib.check_global_batch(inputs, 1)
    needed = accumulation_steps * num_towers
    if static_batch is not None:
        check_batch_covers_micro_batches(static_batch, accumulation_steps, num_towers)
    with tf.name_scope("micro_batches"):
        if static_batch is None:
            batch = tf.shape(tf.nest.flatten(inputs)[0])[0]
            check = tf.debugging.assert_greater_equal(
                batch, needed, message=run_time.message(
                    f"The global batch is smaller than accumulation_steps x towers "
                    f"({needed}); some tower would get no example in some micro-batch"))
            with tf.control_dependencies([check]):
                inputs = tf.nest.map_structure(tf.identity, inputs)
        shards, sizes = inputs_lib.split_global_batch(
            inputs, accumulation_steps, host_device=host_device)
        with tf.device(host_device):
            total = tf.cast(tf.add_n(sizes), tf.float32, name="global_batch")
    return shards, total


def _prebuilt_inputs(input_fn, accumulation_steps, devices, bn_mode, host_device):
    """Calls input_fn for every micro-batch and tower up front, so that B is known."""
    del host_device  # each tower's input is built on that tower's host
    from towerlib.step import devices as devices_lib  # pylint: disable=import-outside-toplevel
    built, sizes = [], []
    for micro_batch in range(accumulation_steps):
        per_tower = []
        for index, device in enumerate(devices):
            ctx = TowerContext(index=index, num_towers=len(devices), device=device,
                               is_training=True, bn_mode=bn_mode, micro_batch=micro_batch)
            with tf.device(devices_lib.host_cpu(device)), \
                    tf.name_scope(f"micro_batch_{micro_batch}_tower_{index}_input"):
                batch = input_fn(ctx)
                sizes.append(inputs_lib.leading_batch_size(batch))
            per_tower.append(batch)
        built.append(lambda ctx, per_tower=per_tower: per_tower[ctx.index])
    with tf.device(devices_lib.host_cpu(devices[0])):
        total = tf.cast(tf.add_n(sizes), tf.float32, name="global_batch")
    return built, total


def after(inputs, gradients, host_device):
    """`inputs` (a nest, or an input function) made to wait for `gradients`.

    The wait is what runs the micro-batches one after the other (see the
    module docstring); with no gradients the inputs come back unchanged.
    Every input waits on one NoOp on the host, the micro-batch's gate, which
    waits on the gradients not already behind the previous micro-batch's
    gate, and on that gate: a chain, so the control edges grow linearly with
    the micro-batches (gradients + 1 + inputs each) whether the caller passes
    the previous micro-batch's gradients or every earlier one's. The waiting
    identities stay on each input's device (else the host's), so no
    micro-batch is moved to a GPU whole.
    """
    waits = [g.values if isinstance(g, tf.IndexedSlices) else g for g in gradients]
    if not waits:
        return inputs
    gate = _gate([w.op for w in waits], host_device)

    def wait(tensor):
        with tf.device(tensor.device or host_device):
            return tf.identity(tensor)

    def gate_nest(nest):
        with tf.control_dependencies([gate]):
            return tf.nest.map_structure(wait, nest)

    if callable(inputs):
        return lambda ctx: gate_nest(inputs(ctx))
    return gate_nest(inputs)


@dataclasses.dataclass(frozen=True)
class _Gate:
    """A micro-batch's gate, by name (a graph's ops would keep the graph alive)."""

    name: str
    covers: frozenset  # the names of every op it waits for, itself or through earlier gates


# The newest gate built in each graph, so that the next one chains to it.
_LAST_GATE = weakref.WeakKeyDictionary()


def _gate(ops, host_device):
    """One NoOp that runs after `ops`, chained to the previous gate when that covers part of them.

    build_train_graph passes every earlier micro-batch's gradients; those
    the previous gate already waits for are reached through it (one edge)
    instead of again. A list the previous gate does not fall within (a new
    build in the same graph) starts a new chain.
    """
    graph = ops[0].graph
    ops = list({op.name: op for op in ops}.values())
    covers = frozenset(op.name for op in ops)
    control = ops
    previous = _LAST_GATE.get(graph)
    if previous is not None and previous.covers <= covers:
        control = [op for op in ops if op.name not in previous.covers]
        control.append(graph.get_operation_by_name(previous.name))
    with tf.device(host_device), tf.control_dependencies(control):
        gate = tf.no_op(name="wait_for_gradients")
    _LAST_GATE[graph] = _Gate(gate.name, covers)
    return gate


def per_tower(towers, shares, num_towers):
    """(losses, shares, outputs, contexts), one per tower over its micro-batches.

    `towers` and `shares` list every micro-batch's towers, micro-batch major.
    Without accumulation they come back as they are. With it, tower i's loss
    is the mean over all its examples (sum_j n_ji loss_ji / sum_j n_ji), its
    share sum_j n_ji / B, each of its outputs a list with one value per
    micro-batch, and its context micro-batch 0's with the tower's whole
    batch size (sum_j n_ji: examples/sec counts every micro-batch).
    """
    if len(towers) == num_towers:
        return ([t.loss for t in towers], list(shares), [t.outputs for t in towers],
                [t.context for t in towers])
    losses, tower_shares, outputs, contexts = [], [], [], []
    for index in range(num_towers):
        own, own_shares = towers[index::num_towers], shares[index::num_towers]
        share = tf.add_n(own_shares)
        losses.append(tf.add_n([s * t.loss for s, t in zip(own_shares, own)]) / share)
        tower_shares.append(share)
        outputs.append({key: [t.outputs[key] for t in own] for key in own[0].outputs})
        contexts.append(dataclasses.replace(own[0].context, batch_size=_total(
            [t.context.batch_size for t in own])))
    return losses, tower_shares, outputs, contexts


def _total(batch_sizes):
    """The sum of int32 scalars: a constant when every one is known statically."""
    known = [tf.get_static_value(size) for size in batch_sizes]
    if all(value is not None for value in known):
        return tf.constant(int(sum(known)), tf.int32)
    return tf.add_n(batch_sizes)

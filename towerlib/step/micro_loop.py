"""Gradient accumulation in a loop: the towers built once, run k times per step.

With ``accumulation_steps=k`` the towers and their gradients are built ONCE,
as the body of a tf.while_loop that runs the step's k micro-batches within
its one session run (towerlib.step.accumulation says how the global batch is
split). The graph, its build time and the first step's set-up do not grow
with k; the towers' inputs (the whole global batch) are sliced by the loop's
counter.

Why a loop in one run, not k session runs: a step stays one train op, so
run_training, hooks, summaries, checkpoints, the logged loss and learning-
rate schedules count optimizer steps as they are, a user's own Session loop
runs a step as before, and a checkpoint can never hold half a step (or a
data position in the middle of one). Collectives in the body (sync batch
norm) pair up per iteration: TensorFlow keys their executions by loop frame
and iteration as well as by instance key.

What crosses iterations is kept in step-local buffers (towerlib.step.
micro_state: bare resources on the device of the tower that fills them,
never saved), made while the body is built (the loop's structure is not
known before) and zeroed before the loop, every step:

    gradients          per tower and dense gradient, a buffer added to in
                       place; sparse gradients as their rows and indices
    batch-norm moments per layer and tower: (count, mean, variance), pooled
                       micro-batch by micro-batch with Chan's formula
    losses             per tower sum_j (n_ji / B) loss_ji and sum_j n_ji / B;
                       the weighted activity terms; the weights' terms
    tower scalars      per tower sum_j (n_ji / B) value_ji

A step cut short leaves nothing the next one reads. Micro-batch j + 1
starts after every write of micro-batch j (the counter waits for them, and
parallel_iterations=1), so one micro-batch's activations are alive at a
time. Ops the tower function adds to UPDATE_OPS run once per step, with
micro-batch 0 (a copy of each in a branch taken at j = 0).

After the loop the builder sees what k = 1 gives: per tower one list of
(gradient, variable), one loss, share and batch-norm record, so the
variable update, the batch-norm updates, loss scaling and the apply are the
code of k = 1. Fetchable per-tower outputs (`TrainGraph.tower_outputs`) are
not kept across micro-batches: use towerlib.tower_scalar for metrics.

    result = accumulate(build_micro_batch, stacks, accumulation_steps, devices)
    # build_micro_batch(inputs_fn, weight_gate) -> MicroBatch, called once
"""

import contextlib
import dataclasses
from typing import Any, Callable, List

import tensorflow as tf

from towerlib.internals import device_scopes, function_graphs, function_reentry, gradient_captures
from towerlib.step.context import TowerRecords
from towerlib.step.micro_state import StepState

__all__ = ["LoopResult", "MicroBatch", "StepParts", "accumulate"]

# Gradients of at least this many elements (256 KB in float32) get a buffer each.
_OWN_BUFFER_MIN_ELEMENTS = 1 << 16


@dataclasses.dataclass
class StepParts:
    """A step's towers and what the builder needs of them.

    Attributes:
      towers: the towers (data losses), tower 0 first.
      shares: each tower's n / B.
      grads_and_vars: per tower, its (gradient, variable) pairs.
      records: the towers' TowerRecords (batch norm, scalars).
      weight_terms: the weights' regularization terms, counted once.
      weighted_activity: the towers' activity terms weighted by their shares.
    """

    towers: List[Any]
    shares: List[tf.Tensor]
    grads_and_vars: List[List[Any]]
    records: TowerRecords
    weight_terms: List[tf.Tensor]
    weighted_activity: List[tf.Tensor]


@dataclasses.dataclass
class MicroBatch(StepParts):
    """What the body's one build of the towers made (tensors of the body); and
    `update_ops`, the tower function's own ops to run once per step."""

    update_ops: List[tf.Operation] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class LoopResult(StepParts):
    """The step's totals over its micro-batches (tensors of the graph around the loop):
    per tower one loss (the mean over its micro-batches, its context's batch_size every
    micro-batch's rows, no outputs), sum_j n_ji / B, the summed gradients, one
    batch-norm entry per layer (pooled over the micro-batches) and one scalar each;
    and `buffers`, the handles of the step-local buffers the sums are kept in."""

    buffers: tuple = ()


def accumulate(build_micro_batch: Callable, stacks, accumulation_steps: int,
               devices, host_device) -> LoopResult:
    """Runs `build_micro_batch`'s towers once per micro-batch, in one loop.

    Args:
      build_micro_batch: (inputs_fn, weight_gate) -> MicroBatch, where
        inputs_fn(ctx) is tower ctx.index's micro-batch and weight_gate a
        float32 scalar, 1 at micro-batch 0 and 0 after. Called once.
      stacks: per tower, a towerlib.step.accumulation.TowerStack.
      accumulation_steps: k >= 2.
      devices: the towers' devices; host_device: where the counter lives.
    """
    built = {}
    graph = tf.compat.v1.get_default_graph()
    build_scopes = device_scopes.open_scopes()
    towers_scope = _towers_scope(graph, len(devices))

    def body(index):
        with function_reentry.plain_reentry(tf.compat.v1.get_default_graph()):
            return build_body(index)

    def build_body(index):
        is_first = tf.equal(index, 0)
        weight_gate = tf.cast(is_first, tf.float32)
        # The towers see the device scopes around the build, as at k = 1, not the
        # loop's host scope, which each of their ops would pay for (device_scopes).
        with device_scopes.scopes_replaced_by(build_scopes), towers_scope():
            micro = build_micro_batch(lambda ctx: stacks[ctx.index].micro_batch(index),
                                      weight_gate)
        state = StepState(devices)
        _keep_gradients(state, micro.grads_and_vars)
        _keep_losses(state, micro)
        _keep_statistics(state, micro.records)
        _keep_scalars(state, micro.records, micro.shares)
        writes = state.write() + [_once(is_first, micro.update_ops)]
        built.update(micro=micro, state=state)
        with tf.control_dependencies(writes):
            return index + 1

    # The towers' gradients are taken inside the body: see gradient_captures.
    with tf.device(host_device), tf.name_scope("accumulation"), \
            gradient_captures.indexed_capture_lookups():
        done = tf.compat.v1.while_loop(
            lambda index: index < accumulation_steps, body, [tf.constant(0)],
            parallel_iterations=1, back_prop=False, name="micro_batch_loop")
    _drop_what_the_body_left_in_collections(graph)
    with tf.control_dependencies([done]):
        return _totals(built["micro"], built["state"], stacks)


def _towers_scope(graph, num_towers):
    """A context for the body's towers: none, or a scope reserved in `graph`.

    The body names its ops afresh, so its towers are 'tower_i/' whatever the
    graph holds. When the graph already has a 'tower_i' (an evaluation built
    before), collections shared with the body would mix the two: the towers
    then go under a scope reserved here ('micro/tower_i/').
    """
    taken = any(graph.unique_name(f"tower_{index}", mark_as_used=False) != f"tower_{index}"
                for index in range(num_towers))
    if not taken:
        return contextlib.nullcontext
    scope = graph.unique_name("micro") + "/"
    return lambda: tf.name_scope(scope)


def _keep_gradients(state, grads_and_vars):
    for tower_index, pairs in enumerate(grads_and_vars):
        for position, (gradient, variable) in enumerate(pairs):
            if gradient is None:
                continue
            key = ("gradient", tower_index, position)
            if isinstance(gradient, tf.IndexedSlices):
                state.append(key + ("values",), gradient.values, tower_index)
                state.append(key + ("indices",), gradient.indices, tower_index)
            else:
                # A large gradient is added into a buffer of its own, in place; small
                # ones are packed into one (a copy of little, and fewer buffers).
                size = variable.shape.num_elements() or 0
                state.add(key, gradient, tower_index, static_shape=variable.shape,
                          own_buffer=size >= _OWN_BUFFER_MIN_ELEMENTS)


def _keep_losses(state, micro):
    for tower_index, (tower, share) in enumerate(zip(micro.towers, micro.shares)):
        state.add(("loss", tower_index), share * tf.cast(tower.loss, tf.float32), tower_index)
        state.add(("share", tower_index), share, tower_index)
    if micro.weighted_activity:
        state.add(("activity",), tf.add_n(micro.weighted_activity), 0)
    if micro.weight_terms:
        state.keep_last(("weight_terms",), tf.add_n(micro.weight_terms), 0)


def _keep_statistics(state, records):
    for layer, entries in records.batch_norm.items():
        for position, statistics in enumerate(entries):
            state.pool(("batch_norm", layer, position), statistics, statistics.tower_index)


def _keep_scalars(state, records, shares):
    for name, entries in records.scalars.items():
        for position, ((_, tower_index), value) in enumerate(entries):
            state.add(("scalar", name, position),
                      shares[tower_index] * tf.cast(value, tf.float32), tower_index)


def _once(is_first, update_ops):
    """Runs a copy of each of the tower function's update ops at micro-batch 0 only.

    The originals stay in the body without anything depending on them, so
    they never run; their copies sit in the branch taken at j = 0. A group
    (a NoOp) is replaced by what it groups.
    """
    ops = _update_leaves([getattr(op, "op", op) for op in update_ops])
    if not ops:
        return tf.no_op()

    def run_copies():
        copies = [function_graphs.copy_op(op, f"{op.name.replace('/', '_')}_once")
                  for op in ops]
        with tf.control_dependencies(copies):
            return tf.constant(True)

    return tf.cond(is_first, run_copies, lambda: tf.constant(False), name="update_ops_once")


def _update_leaves(ops):
    """The ops that do the updating: groups (NoOps) opened, recursively, so that the
    grouped ops are copied (a copy of the group would wait for the originals)."""
    leaves = []
    for op in ops:
        if op.type == "NoOp":
            leaves.extend(_update_leaves(list(op.control_inputs)))
        else:
            leaves.append(op)
    return leaves


def _drop_what_the_body_left_in_collections(graph):
    """The body's tensors and ops cannot be used outside it: out of every collection.

    Summaries the tower function wrote are said once (towerlib.tower_scalar is
    the way). Variables made in the body live outside it and stay;
    regularization losses made by get_variable are rebuilt at each use and stay.
    """
    dropped_summaries = []
    for key in graph.get_all_collection_keys():
        items = graph.get_collection_ref(key)
        kept = [item for item in items if not _made_in_a_body(item, graph)]
        if len(kept) != len(items):
            if key == tf.compat.v1.GraphKeys.SUMMARIES:
                dropped_summaries = [item for item in items if _made_in_a_body(item, graph)]
            items[:] = kept
    if dropped_summaries:
        tf.compat.v1.logging.warning(
            "accumulation_steps > 1: %d summaries written inside the tower function "
            "(e.g. %s) are left out (the towers run in a loop, whose tensors cannot be "
            "fetched). Use towerlib.tower_scalar(ctx, name, value) instead: it is "
            "averaged over the towers and micro-batches.", len(dropped_summaries),
            dropped_summaries[0].name)


def _made_in_a_body(item, graph):
    if not isinstance(item, (tf.Tensor, tf.Operation, tf.Variable)):
        return False  # e.g. a regularization loss get_variable rebuilds where it is used
    op = item if isinstance(item, tf.Operation) else getattr(item, "op", None)
    return (isinstance(op, tf.Operation) and op.graph is not graph
            and function_graphs.is_inside(op.graph, graph))


def _totals(micro, state, stacks):
    """The LoopResult: every kept value read back after the loop."""
    grads_and_vars = []
    for tower_index, pairs in enumerate(micro.grads_and_vars):
        summed = []
        for position, (gradient, variable) in enumerate(pairs):
            key = ("gradient", tower_index, position)
            if gradient is None:
                summed.append((None, variable))
            elif isinstance(gradient, tf.IndexedSlices):
                summed.append((tf.IndexedSlices(
                    state.read(key + ("values",)), state.read(key + ("indices",)),
                    tf.constant(variable.shape.as_list(),
                                dtype=gradient.dense_shape.dtype
                                if gradient.dense_shape is not None else tf.int64)),
                    variable))
            else:
                summed.append((state.read(key), variable))
        grads_and_vars.append(summed)
    towers, shares = [], []
    for tower_index, tower in enumerate(micro.towers):
        share = state.read(("share", tower_index))
        loss = state.read(("loss", tower_index)) / share
        rows = stacks[tower_index].rows()
        context = dataclasses.replace(tower.context, batch_size=rows)
        towers.append(dataclasses.replace(tower, context=context, loss=loss, outputs={},
                                          update_ops=[], inputs=stacks[tower_index].inputs))
        shares.append(share)
    records = TowerRecords(micro.records.num_towers)
    for layer, entries in micro.records.batch_norm.items():
        for position, statistics in enumerate(entries):
            count, mean, variance = state.read_pooled(("batch_norm", layer, position))
            records.add_batch_norm(layer, dataclasses.replace(
                statistics, count=count, mean=mean, variance=variance))
    for name, entries in micro.records.scalars.items():
        for position, ((_, tower_index), _) in enumerate(entries):
            records.add_scalar(name, (0, tower_index),
                               state.read(("scalar", name, position)) / shares[tower_index])
    activity = [state.read(("activity",))] if micro.weighted_activity else []
    weight_terms = [state.read(("weight_terms",))] if micro.weight_terms else []
    return LoopResult(towers, shares, grads_and_vars, records, weight_terms, activity,
                      state.buffers())


"""Gradient accumulation: the micro-batches of one optimizer step, per tower.

With ``accumulation_steps=k`` the global batch of B examples is split k ways
(the first B mod k micro-batches get one example more) and each micro-batch
over the towers as usual. Micro-batch j's tower i weights its mean loss by
n_ji / B, so the summed gradient is exactly one device's gradient on the
whole global batch; the regularization is added once. The towers are built
once and run k times in a loop within the step (towerlib.step.micro_loop):
one train op per optimizer step, so run_training, hooks, checkpoints and
learning-rate schedules see nothing new, and a checkpoint never holds half
an accumulated step.

Here: the split. Each tower's k shards are laid end to end (`TowerStack`),
so that the loop's micro-batch j slices its rows by a counter.

For example B = 10, k = 2 and 2 towers give micro-batches of 5 and 5 and
shards of 3 + 2 in each; tower 0's stack holds rows 0-2 and 5-7, its shares
are 0.3 and 0.3, tower 1's 0.2 and 0.2.

With an input function, ``input_fn(ctx)`` is called once per tower and
micro-batch up front (``ctx.micro_batch`` says which), so that B is known
before the loop; B is the sum of what they return.
"""

import dataclasses
import numbers
from typing import Any

import tensorflow as tf

from towerlib.checks import run_time, tower_batch
from towerlib.step import inputs as inputs_lib
from towerlib.step.context import TowerContext

__all__ = ["TowerStack", "check_accumulation_steps", "check_batch_covers_micro_batches",
           "tower_stacks"]


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


def tower_stacks(inputs, accumulation_steps, devices, bn_mode, host_device):
    """(per tower a TowerStack, B as a float32 scalar) for k >= 2 micro-batches.

    A nest global batch is not copied: each tower's stack is the whole batch
    with that tower's offsets into it (a few ops, whatever k). An input
    function is called once per tower and micro-batch here, and each
    tower's calls laid end to end.
    """
    num_towers = len(devices)
    if callable(inputs):
        return _called_stacks(inputs, accumulation_steps, devices, bn_mode)
    static_batch = inputs_lib.check_global_batch(inputs, 1)
    needed = accumulation_steps * num_towers
    if static_batch is not None:
        check_batch_covers_micro_batches(static_batch, accumulation_steps, num_towers)
    with tf.device(host_device), tf.name_scope("micro_batches"):
        if static_batch is None:
            batch = tf.shape(tf.nest.flatten(inputs)[0], out_type=tf.int32)[0]
            check = tf.debugging.assert_greater_equal(
                batch, needed, message=run_time.message(
                    f"The global batch is smaller than accumulation_steps x towers "
                    f"({needed}); some tower would get no example in some micro-batch"))
            with tf.control_dependencies([check]):
                inputs = tf.nest.map_structure(tf.identity, inputs)
                batch = tf.identity(batch)
        else:
            batch = tf.constant(static_batch, tf.int32)
        stacks = [_rows_of_tower(inputs, batch, static_batch, accumulation_steps,
                                 num_towers, index) for index in range(num_towers)]
        total = tf.cast(batch, tf.float32, name="global_batch")
    return stacks, total


def _rows_of_tower(inputs, batch, static_batch, accumulation_steps, num_towers, index):
    """Tower `index`'s rows of every micro-batch, as offsets into the global batch.

    Micro-batch j has m_j = B // k (+1 for j < B mod k) rows from M_j =
    m_0 + ... + m_(j-1); tower i takes n_ji = m_j // N (+1 for i <
    m_j mod N) of them, from M_j + i (m_j // N) + min(i, m_j mod N): the
    split of towerlib.step.inputs, applied twice.
    """
    k, n = accumulation_steps, num_towers
    if static_batch is not None:
        sizes, offsets, start = [], [], 0
        for rows in inputs_lib.shard_sizes(static_batch, k):
            per_tower = inputs_lib.shard_sizes(rows, n)
            sizes.append(per_tower[index])
            offsets.append(start + sum(per_tower[:index]))
            start += rows
        static_size = sizes[0] if len(set(sizes)) == 1 else None
        return TowerStack(inputs, tf.constant(sizes, tf.int32),
                          tf.constant(offsets, tf.int32), static_size)
    micro_rows = inputs_lib.shard_sizes(batch, k)  # [k]
    micro_start = tf.cumsum(micro_rows, exclusive=True)
    tower_base, tower_extra = micro_rows // n, micro_rows % n
    sizes = tower_base + tf.cast(index < tower_extra, tf.int32)
    offsets = micro_start + index * tower_base + tf.minimum(index, tower_extra)
    return TowerStack(inputs, sizes, offsets, None)


def _called_stacks(input_fn, accumulation_steps, devices, bn_mode):
    """Calls input_fn for every micro-batch and tower up front, so that B is known."""
    from towerlib.step import devices as devices_lib  # pylint: disable=import-outside-toplevel
    per_tower = [[] for _ in devices]
    for micro_batch in range(accumulation_steps):
        for index, device in enumerate(devices):
            ctx = TowerContext(index=index, num_towers=len(devices), device=device,
                               is_training=True, bn_mode=bn_mode, micro_batch=micro_batch)
            with tf.device(devices_lib.host_cpu(device)), \
                    tf.name_scope(f"micro_batch_{micro_batch}_tower_{index}_input"):
                per_tower[index].append(input_fn(ctx))
    stacks, sizes = [], []
    for index, device in enumerate(devices):
        own = per_tower[index]
        for micro_batch, batch in enumerate(own):
            _check_rows(batch, index, micro_batch)
        own_sizes = [inputs_lib.leading_batch_size(batch) for batch in own]
        sizes.extend(own_sizes)
        known = {tower_batch.static_int(size) for size in own_sizes}
        static_size = known.pop() if len(known) == 1 and None not in known else None
        with tf.device(devices_lib.host_cpu(device)), \
                tf.name_scope(f"tower_{index}_micro_batches"):
            inputs = tf.nest.map_structure(lambda *parts: tf.concat(parts, axis=0), *own)
            size_vector = tf.stack([tf.cast(size, tf.int32) for size in own_sizes])
            offsets = tf.cumsum(size_vector, exclusive=True)
        stacks.append(TowerStack(inputs, size_vector, offsets, static_size))
    with tf.device(devices_lib.host_cpu(devices[0])):
        total = tf.cast(tf.add_n(sizes), tf.float32, name="global_batch")
    return stacks, total


def _check_rows(batch, tower_index, micro_batch):
    """Refuses an entry without one row per example: it could not be laid end to end."""
    flat = tf.nest.flatten(batch)
    first_rows = next((tf.compat.dimension_value(t.shape[0]) for t in flat
                       if t.shape.rank and t.shape[0] is not None), None)
    for tensor in flat:
        rows = tf.compat.dimension_value(tensor.shape[0]) if tensor.shape.rank else None
        if tensor.shape.rank == 0 or None not in (rows, first_rows) and rows != first_rows:
            raise ValueError(
                f"accumulation_steps > 1: the input function's batch for tower "
                f"{tower_index}, micro-batch {micro_batch} has an entry {tensor.name} of "
                f"shape {tensor.shape}, not one row per example ({first_rows} examples). "
                "Each tower's micro-batches are laid end to end and sliced by rows, so "
                "every entry needs the examples on axis 0. Fix: return per-example "
                "tensors only; build constants inside the tower function.")


@dataclasses.dataclass(frozen=True)
class TowerStack:
    """One tower's rows of each of the k micro-batches, in one nest of tensors.

    Attributes:
      inputs: a nest of tensors holding the rows (the global batch, or the
        tower's input-function batches laid end to end).
      sizes: int32 [k], n_ij, the rows of micro-batch j.
      offsets: int32 [k], where micro-batch j's rows start in `inputs`.
      static_size: n_ij when every micro-batch gives this tower as many rows
        and that is known while building, else None.
    """

    inputs: Any
    sizes: tf.Tensor
    offsets: tf.Tensor
    static_size: Any

    def micro_batch(self, index):
        """Micro-batch `index`'s rows (int32 scalar tensor index), shaped when known."""
        start, size = self.offsets[index], self.sizes[index]

        def rows(tensor):
            shard = tensor[start:start + size]
            if self.static_size is not None:
                shard.set_shape([self.static_size] + tensor.shape.as_list()[1:])
            return shard

        return tf.nest.map_structure(rows, self.inputs)

    def rows(self):
        """This tower's examples over the step: an int32 scalar, constant when known."""
        static = tf.get_static_value(self.sizes)
        if static is not None:
            return tf.constant(int(static.sum()), tf.int32)
        return tf.reduce_sum(self.sizes)

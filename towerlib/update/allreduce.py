"""All-reduce of the towers' gradients, for replicated variables.

Every tower differentiates its own weighted loss with respect to its own
copies (towerlib.update.copies); the sum over towers of those gradients is
the parameter-server aggregate, and every tower needs all of it. The sums go
through the same CrossTowerReducer as sync batch norm's statistics (one code
path: the graph hub on CPU towers, collectives with NCCL between GPUs).

Dense gradients are packed (Horovod's tensor fusion): consecutive gradients
of one dtype are concatenated into buffers of at most `pack_bytes` bytes,
each buffer summed by one exchange and split after. A gradient larger than
the limit goes alone; `pack_bytes=0` sends every gradient alone. For example
with pack_bytes=1024, float32 gradients of 100, 100 and 300 elements (400,
400 and 1200 bytes) make two exchanges, the last gradients first (backprop
computes them first): [300], then [100 + 100].

Sparse gradients (IndexedSlices, from embedding lookups) stay sparse: the
towers' slices are all-gathered and concatenated in tower order, which is
what the parameter-server path hands the optimizer. Towers may hold
different numbers of rows, so each tower's row count is gathered first and
the rows are padded to the largest count for the exchange, then the padding
is dropped: no zero row ever reaches the optimizer (a sparse Momentum or Adam
would otherwise update the slots of row 0).
"""

from typing import List

import tensorflow as tf

__all__ = ["allreduce_gradients", "check_same_gradients", "pack_groups"]


def pack_groups(tensors, pack_bytes: int) -> List[List[int]]:
    """Indices of `tensors` grouped into buffers of at most `pack_bytes` bytes.

    Groups keep the tensors' order and never mix dtypes; a tensor whose size
    is unknown, or larger than the limit, is a group of its own.
    """
    groups, current, current_bytes, current_dtype = [], [], 0, None
    for index, tensor in enumerate(tensors):
        elements = tensor.shape.num_elements()
        size = None if elements is None else elements * tensor.dtype.size
        fits = (size is not None and current and tensor.dtype == current_dtype
                and current_bytes + size <= pack_bytes)
        if not fits and current:
            groups.append(current)
            current, current_bytes = [], 0
        current.append(index)
        current_bytes += size or 0
        current_dtype = tensor.dtype
        if size is None or size > pack_bytes:
            groups.append(current)
            current, current_bytes = [], 0
    if current:
        groups.append(current)
    return groups


def _sum_dense(reducer, gradients, tower_index, pack_bytes):
    """The towers' sums of `gradients` (dense tensors), in their order.

    Buffers are formed and exchanged from the last gradient to the first:
    backprop computes the last layers' gradients first, so the first
    exchanges can start while it goes on (and NCCL launches them in this
    creation order on every GPU).
    """
    summed = [None] * len(gradients)
    last_first = list(reversed(range(len(gradients))))
    for reversed_group in pack_groups([gradients[i] for i in last_first], pack_bytes):
        group = [last_first[i] for i in reversed_group]
        name = f"gradients_{group[0]}" + (f"_to_{group[-1]}" if len(group) > 1 else "")
        results = reducer.sum([gradients[i] for i in group], tower_index=tower_index,
                              name=name, differentiable=False)
        for i, result in zip(group, results):
            summed[i] = result
    return summed


def _gather_sparse(reducer, slices, tower_index, name):
    """IndexedSlices holding every tower's rows of `slices`, in tower order."""
    rows = tf.shape(slices.indices, out_type=tf.int32)[:1]  # [1]
    counts = tf.reshape(reducer.gather(rows, tower_index, name=name + "/rows"), [-1])
    padding = tf.reduce_max(counts) - rows[0]
    values = tf.pad(slices.values,
                    [[0, padding]] + [[0, 0]] * (slices.values.shape.rank - 1))
    indices = tf.pad(slices.indices, [[0, padding]])
    gathered_values = reducer.gather(values, tower_index, name=name + "/values")
    gathered_indices = reducer.gather(indices, tower_index, name=name + "/indices")
    # [towers, max rows] -> keep the first counts[t] rows of tower t.
    keep = tf.sequence_mask(counts, tf.shape(gathered_indices)[1])
    return tf.IndexedSlices(
        values=tf.boolean_mask(gathered_values, keep),
        indices=tf.boolean_mask(gathered_indices, keep),
        dense_shape=slices.dense_shape)


def nothing_to_add(shape, dtype):
    """What a member that does not hold a value sends, so that the sum is that value.

    For floating dtypes -0.0, the exact additive identity (-0.0 + x is x for every
    x, -0.0 and NaN included, where +0.0 + -0.0 would give +0.0); else 0.
    """
    dtype = tf.as_dtype(dtype)
    if dtype.is_floating:
        return tf.fill(shape, tf.constant(-0.0, dtype))
    return tf.zeros(shape, dtype)


def check_same_gradients(tower_gradients):
    """Every tower has a gradient where tower 0 has one (replicated towers are alike)."""
    first = tower_gradients[0]
    for index, gradients in enumerate(tower_gradients):
        if [g is None for g in gradients] != [g is None for g in first]:
            raise ValueError(f"Tower {index} has gradients where tower 0 has none "
                             "(or the reverse); replicated towers must be identical.")


def allreduce_gradients(reducer, tower_gradients, pack_bytes, wire_dtype=None, riders=None):
    """Each tower's gradients replaced by their sum over the towers.

    `riders` (None, or per tower a list of float32 vectors, the same shapes in
    every tower) are small sums of the step that cross in the gradients'
    buffers instead of exchanges of their own (towerlib.step.across_workers):
    with float32 gradients in the first buffer sent, else in one float32
    exchange of their own. Their sums are the second item returned.

    Args:
      reducer: a CrossTowerReducer over the towers' devices.
      tower_gradients: per tower, the list of gradients (Tensor,
        IndexedSlices or None) for its copies, every tower listing the same
        variables in the same order; None must be None in every tower.
      pack_bytes: the buffer size for packing dense gradients (0: no packing).
      wire_dtype: None to sum float32 gradients as they are, or a half type
        (the compute dtype) to send and sum them in it: half the bytes, sums
        rounded to it; cast back to each gradient's dtype after.

    Returns:
      Per tower, the summed gradients in the same order (None stays None),
      built on that tower's device; every tower's sums are the same bits. With
      `riders`, a pair: that, and per tower the riders' sums in their order.
    """
    first = tower_gradients[0]
    check_same_gradients(tower_gradients)
    dense_positions = [i for i, g in enumerate(first)
                       if g is not None and not isinstance(g, tf.IndexedSlices)]
    sparse_positions = [i for i, g in enumerate(first) if isinstance(g, tf.IndexedSlices)]
    reduced, rider_sums = [], []
    for tower_index, gradients in enumerate(tower_gradients):
        # Casts, pads and masks on the tower's device: none goes to a default GPU.
        with tf.name_scope(f"allreduce_tower_{tower_index}"), \
                tf.device(reducer.devices[tower_index]):
            result = list(gradients)
            dense = [tf.convert_to_tensor(gradients[i]) for i in dense_positions]
            sent = dense if wire_dtype is None else [tf.cast(g, wire_dtype) for g in dense]
            own_riders = [] if riders is None else list(riders[tower_index])
            # Last in the list: the first buffer sent, when float32 gradients are in it.
            carried = own_riders if (wire_dtype is None and any(
                g.dtype == tf.float32 for g in sent)) else []
            summed = _sum_dense(reducer, sent + carried, tower_index, pack_bytes)
            for position, total, original in zip(dense_positions, summed, dense):
                result[position] = tf.cast(total, original.dtype)
            if own_riders and not carried:
                summed = summed + reducer.sum(own_riders, tower_index=tower_index,
                                              name="riders", differentiable=False)
            rider_sums.append(summed[len(dense):])
            for position in sparse_positions:
                result[position] = _gather_sparse(
                    reducer, gradients[position], tower_index, f"sparse_gradient_{position}")
            reduced.append(result)
    return reduced if riders is None else (reduced, rider_sums)

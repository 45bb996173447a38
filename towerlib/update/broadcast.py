"""Starting every worker's copies from the chief's values.

Across workers (update=Replicated() with a WorkerGroup) each process holds its
own copies of every variable, initialized on its own: with random
initializers, or from a checkpoint, the workers would start apart. The
broadcast sets every copy of every variable, on every worker, to the chief's
tower 0 value, through the build's exchange: each member contributes the
value (the chief's tower 0) or nothing (-0.0, or 0 for integers: every
other member), and the sum is the chief's value bit for bit, for every dtype
the collectives add. Booleans
and small integers cross as int64 (exact).

    broadcast = broadcast_from_chief(reducer, global_variables, copies)
    session.run(broadcast)   # after initializing or restoring, before step 1

The variables of each dtype are packed into buffers of at most `chunk_bytes`
(a larger variable is a buffer of its own), and every buffer, of every dtype,
goes in one chain: its exchange starts once the previous buffer's values are
assigned. So what is in transit at once is about the larger of `chunk_bytes`
and the largest variable, not the model. (Measured: 2 workers x 2 towers of a
51 M-parameter Adam model, whose largest variables are 49 MiB, by
bench/bench_sharded_update.py: a worker's peak after the start was 9.9 to 10.2
GiB when each dtype went as one buffer, 3.5 GiB in a chain of 32 MiB buffers.)

    variables of 40, 30 and 20 MB (float32), chunk_bytes = 64 MB:
    exchange 1: the 40 MB one (40 + 30 > 64), then exchange 2: 30 + 20 MB
"""

import collections

import tensorflow as tf

from towerlib.update import allreduce

__all__ = ["DEFAULT_CHUNK_BYTES", "broadcast_from_chief"]

# The largest buffer the start broadcast exchanges at once.
DEFAULT_CHUNK_BYTES = 32 << 20

# Integers cross as int64: a collective on GPUs keeps int32 in host memory.
_SENT_AS = {tf.bool: tf.int64, tf.int32: tf.int64, tf.int16: tf.int64, tf.int8: tf.int64,
            tf.uint8: tf.int64}


def broadcast_from_chief(reducer, variables, copies, chunk_bytes=None):
    """An op making every copy of `variables` on every worker equal the chief's.

    Args:
      reducer: the CrossTowerReducer spanning every worker's towers.
      variables: tower 0's variables (the plain names: weights, slots, moving
        statistics, global_step, ...), the same list in the same order on
        every worker.
      copies: {plain name: [tower i's copy]} for the variables that have one
        per tower; the others are held once, by tower 0.
      chunk_bytes: the largest buffer exchanged at once (a larger variable
        goes alone); None: DEFAULT_CHUNK_BYTES, read when called.

    Returns:
      One op: the last buffer's assigns and this process's halves of its
      exchange, which wait, through control edges, for every buffer before it.
    """
    if chunk_bytes is None:
        chunk_bytes = DEFAULT_CHUNK_BYTES
    by_dtype = collections.OrderedDict()
    for variable in variables:
        by_dtype.setdefault(variable.dtype.base_dtype, []).append(variable)
    done = []   # the previous buffer's ops: the next one waits for them
    with tf.name_scope("broadcast_from_chief"):
        for dtype, group in by_dtype.items():
            sent_as = _SENT_AS.get(dtype, dtype)
            specs = [tf.TensorSpec(v.shape, sent_as) for v in group]
            for number, indices in enumerate(allreduce.pack_groups(specs, chunk_bytes)):
                with tf.control_dependencies(done):
                    done = _broadcast_buffer(reducer, [group[i] for i in indices], copies,
                                             dtype, sent_as, f"broadcast_{dtype.name}_{number}")
    return tf.group(*done)


def _broadcast_buffer(reducer, variables, copies, dtype, sent_as, name):
    """One exchange of `variables` (one dtype) from the chief: the ops that end it."""
    ops = []
    for index in range(reducer.num_towers):
        is_source = reducer.member(index) == 0
        with tf.device(reducer.devices[index]):
            sent = [tf.cast(v.read_value(), sent_as) if is_source
                    else allreduce.nothing_to_add(v.shape, sent_as) for v in variables]
        received = reducer.sum(sent, tower_index=index, differentiable=False, name=name)
        for variable, value in zip(variables, received):
            target = _local_copy(variable, index, copies)
            if target is None:
                ops.append(value.op)  # this member's half still runs
            else:
                ops.append(target.assign(tf.cast(value, dtype), read_value=False))
    return ops


def _local_copy(variable, tower_index, copies):
    """Tower `tower_index`'s copy of `variable`, or None when it has none."""
    name = variable.op.name
    if name in copies:
        return copies[name][tower_index]
    return variable if tower_index == 0 else None

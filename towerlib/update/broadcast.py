"""Starting every worker's copies from the chief's values.

Across workers (update=Replicated() with a WorkerGroup) each process holds its
own copies of every variable, initialized on its own: with random
initializers, or from a checkpoint, the workers would start apart. The
broadcast sets every copy of every variable, on every worker, to the chief's
tower 0 value, through the build's exchange: each member contributes the
value (the chief's tower 0) or zeros (every other member), and the sum is
the chief's value exactly, for every dtype the collectives add. Booleans
and small integers cross as int64 (exact).

    broadcast = broadcast_from_chief(reducer, global_variables, copies)
    session.run(broadcast)   # after initializing or restoring, before step 1

One exchange per dtype (the variables of a dtype are packed into one
buffer): ResNet-50 with Momentum sends about 200 MB once per start.
"""

import collections

import tensorflow as tf

__all__ = ["broadcast_from_chief"]

# Integers cross as int64: a collective on GPUs keeps int32 in host memory.
_SENT_AS = {tf.bool: tf.int64, tf.int32: tf.int64, tf.int16: tf.int64, tf.int8: tf.int64,
            tf.uint8: tf.int64}


def broadcast_from_chief(reducer, variables, copies):
    """An op making every copy of `variables` on every worker equal the chief's.

    Args:
      reducer: the CrossTowerReducer spanning every worker's towers.
      variables: tower 0's variables (the plain names: weights, slots, moving
        statistics, global_step, ...), the same list in the same order on
        every worker.
      copies: {plain name: [tower i's copy]} for the variables that have one
        per tower; the others are held once, by tower 0.

    Returns:
      One op: the assigns of every local copy, and every local member's half
      of the exchanges.
    """
    by_dtype = collections.OrderedDict()
    for variable in variables:
        by_dtype.setdefault(variable.dtype.base_dtype, []).append(variable)
    ops = []
    with tf.name_scope("broadcast_from_chief"):
        for dtype, group in by_dtype.items():
            sent_as = _SENT_AS.get(dtype, dtype)
            for index in range(reducer.num_towers):
                is_source = reducer.member(index) == 0
                with tf.device(reducer.devices[index]):
                    sent = [tf.cast(v.read_value(), sent_as) if is_source
                            else tf.zeros(v.shape, sent_as) for v in group]
                received = reducer.sum(sent, tower_index=index, differentiable=False,
                                       name=f"broadcast_{dtype.name}")
                for variable, value in zip(group, received):
                    target = _local_copy(variable, index, copies)
                    if target is None:
                        ops.append(value.op)  # this member's half still runs
                    else:
                        ops.append(target.assign(tf.cast(value, dtype), read_value=False))
    return tf.group(*ops)


def _local_copy(variable, tower_index, copies):
    """Tower `tower_index`'s copy of `variable`, or None when it has none."""
    name = variable.op.name
    if name in copies:
        return copies[name][tower_index]
    return variable if tower_index == 0 else None

"""TensorFlow's graph-mode collective ops (all-reduce, all-gather).

Relies on ``tensorflow.python.ops.collective_ops``, which is not exported as
public API in TF 2.21: ``all_reduce(t, group_size, group_key, instance_key,
merge_op, final_op, communication_hint=, timeout=)`` and ``all_gather(t,
group_size, group_key, instance_key, communication_hint=, timeout=)``. They
make V1 ops of types CollectiveReduce and CollectiveGather (the V2 types are
what tf.distribute makes; both are recognized by ``COLLECTIVE_OP_TYPES``).
With communication_hint='nccl' between GPUs they run as NCCL kernels.
"""

import tensorflow as tf
from tensorflow.python.ops import collective_ops as _tf_collective_ops

__all__ = ["COLLECTIVE_OP_TYPES", "all_gather", "all_reduce", "is_collective_op"]

# Op types whose members pair by (group_key, instance_key) at run time.
COLLECTIVE_OP_TYPES = frozenset(
    ["CollectiveReduce", "CollectiveGather", "CollectiveReduceV2", "CollectiveGatherV2"])


def all_reduce(tensor, group_size, group_key, instance_key, communication_hint,
               timeout_seconds=None):
    """The element-wise sum of `tensor` over the group's members ('Add', 'Id')."""
    return _tf_collective_ops.all_reduce(
        tensor, group_size, group_key, instance_key, merge_op="Add", final_op="Id",
        communication_hint=communication_hint, timeout=timeout_seconds or 0)


def all_gather(tensor, group_size, group_key, instance_key, communication_hint,
               timeout_seconds=None):
    """The members' `tensor`s concatenated along axis 0, in rank order.

    CollectiveGather (V1) takes no bfloat16, so a bfloat16 tensor crosses as
    float32 (both casts exact) and comes back as bfloat16.
    """
    wire = tf.float32 if tensor.dtype == tf.bfloat16 else tensor.dtype
    out = _tf_collective_ops.all_gather(
        tf.cast(tensor, wire), group_size, group_key, instance_key,
        communication_hint=communication_hint, timeout=timeout_seconds or 0)
    return tf.cast(out, tensor.dtype)


def is_collective_op(op: tf.Operation) -> bool:
    """Whether `op` is a collective with static group and instance keys."""
    return op.type in COLLECTIVE_OP_TYPES and "group_key" in op.node_def.attr

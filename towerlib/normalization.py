"""Batch normalization whose treatment of the towers is chosen by `bn_mode`.

In training a layer normalizes with batch statistics:

- 'first_tower' and 'all_towers': each tower with its own shard's statistics;
- 'sync': every tower with the statistics of the whole global batch.

The moving statistics used for inference are not updated by each tower.
Every tower records its (count, mean, variance) in the build's
`TowerRecords`; the builder then emits ONE moving-average update per layer
per step (`moving_average_updates`):

- 'first_tower': from tower 0's shard (the classic tutorial heuristic);
- 'all_towers': from the exact pooled statistics of the global batch;
- 'sync': from the global statistics every tower already shares.

Outside a builder (`ctx.records is None`) the update goes into the
UPDATE_OPS collection, as TF 1 code expects.
"""

import tensorflow as tf

from towerlib.context import BatchNormStatistics


def _moments(x, axes):
    """Shard mean and biased variance, in float32 for half-precision inputs.

    Variance is the mean squared deviation from the mean (two passes), so a
    large common offset does not cancel catastrophically.
    """
    x32 = tf.cast(x, tf.float32) if x.dtype in (tf.float16, tf.bfloat16) else x
    mean, variance = tf.nn.moments(x32, axes)
    return mean, variance


def _sync_moments(x, axes, ctx, layer_name):
    """Mean and variance of the whole global batch across the towers.

    Filled in with bn_mode='sync' (issue 3).
    """
    raise NotImplementedError(
        "bn_mode='sync' is not available yet; use 'first_tower' or 'all_towers'.")


def _count(x, axes):
    shape = tf.shape(x)
    return tf.cast(tf.reduce_prod(tf.gather(shape, axes)), tf.float32)


def _update_moving(variable, value, momentum):
    """variable <- momentum * variable + (1 - momentum) * value."""
    value = tf.cast(value, variable.dtype)
    return variable.assign_sub((variable - value) * (1.0 - momentum))


def batch_norm(x, ctx, *, name, axis=-1, momentum=0.99, epsilon=1e-3,
               center=True, scale=True):
    """Batch normalization over every axis but `axis` (the channels).

    Args:
      x: [N, ..., C] for axis=-1, or e.g. [N, C, H, W] with axis=1.
      ctx: the TowerContext; its is_training and bn_mode decide the statistics.
      name: variable scope of 'beta', 'gamma', 'moving_mean', 'moving_variance'.
      momentum: moving-average decay of the inference statistics.

    Returns:
      A tensor shaped like x.
    """
    rank = x.shape.rank
    if rank is None or rank < 2:
        raise ValueError(f"batch_norm needs an input of known rank >= 2, got {x.shape}.")
    axis = axis % rank
    channels = x.shape[axis]
    if channels is None:
        raise ValueError(f"batch_norm needs a known channel dimension (axis {axis}), "
                         f"got shape {x.shape}.")
    reduce_axes = [a for a in range(rank) if a != axis]
    param_shape = [int(channels)]
    broadcast_shape = [1] * rank
    broadcast_shape[axis] = int(channels)

    with tf.compat.v1.variable_scope(name) as scope:
        beta = tf.compat.v1.get_variable(
            "beta", param_shape, initializer=tf.compat.v1.zeros_initializer(),
            trainable=center)
        gamma = tf.compat.v1.get_variable(
            "gamma", param_shape, initializer=tf.compat.v1.ones_initializer(),
            trainable=scale)
        moving_mean = tf.compat.v1.get_variable(
            "moving_mean", param_shape, trainable=False,
            initializer=tf.compat.v1.zeros_initializer())
        moving_variance = tf.compat.v1.get_variable(
            "moving_variance", param_shape, trainable=False,
            initializer=tf.compat.v1.ones_initializer())

        if ctx.is_training:
            if ctx.bn_mode == "sync" and ctx.num_towers > 1:
                count, mean, variance = _sync_moments(x, reduce_axes, ctx, scope.name)
            else:
                count = _count(x, reduce_axes)
                mean, variance = _moments(x, reduce_axes)
            statistics = BatchNormStatistics(
                tower_index=ctx.index, count=tf.stop_gradient(count),
                mean=tf.stop_gradient(mean), variance=tf.stop_gradient(variance),
                moving_mean=moving_mean, moving_variance=moving_variance,
                momentum=momentum)
            if ctx.records is not None:
                ctx.records.add_batch_norm(scope.name, statistics)
            else:
                for update in _updates_from(statistics):
                    tf.compat.v1.add_to_collection(
                        tf.compat.v1.GraphKeys.UPDATE_OPS, update)
        else:
            mean, variance = moving_mean, moving_variance

        def shaped(t):
            # [C] broadcasts against a channels-last input as it is.
            t = tf.cast(t, x.dtype)
            return t if axis == rank - 1 else tf.reshape(t, broadcast_shape)

        return tf.nn.batch_normalization(
            x, shaped(mean), shaped(variance),
            shaped(beta) if center else None,
            shaped(gamma) if scale else None, epsilon)


def _updates_from(statistics):
    with tf.device(statistics.moving_mean.device):
        return [
            _update_moving(statistics.moving_mean, statistics.mean, statistics.momentum),
            _update_moving(statistics.moving_variance, statistics.variance,
                           statistics.momentum),
        ]


def pooled_statistics(tower_statistics):
    """Exact (count, mean, variance) of the union of several towers' shards.

    Chan's combination: the pooled variance is the count-weighted mean of each
    shard's variance plus the spread of the shard means around the pooled
    mean, so no sum of squares of raw values is ever formed.
    """
    counts = [s.count for s in tower_statistics]
    total = tf.add_n(counts)
    weights = [c / total for c in counts]
    mean = tf.add_n([w * s.mean for w, s in zip(weights, tower_statistics)])
    variance = tf.add_n([
        w * (s.variance + tf.square(s.mean - mean))
        for w, s in zip(weights, tower_statistics)])
    return total, mean, variance


def moving_average_updates(records, bn_mode):
    """One moving-average update per batch-norm layer, per `bn_mode`.

    Returns a list of ops; run them once per step (the train op does, under
    control dependencies).
    """
    updates = []
    with tf.name_scope("batch_norm_updates"):
        for layer_statistics in records.batch_norm.values():
            first = layer_statistics[0]
            if bn_mode == "all_towers" and len(layer_statistics) > 1:
                with tf.device(first.moving_mean.device):
                    _, mean, variance = pooled_statistics(layer_statistics)
                first = BatchNormStatistics(
                    tower_index=-1, count=None, mean=mean, variance=variance,
                    moving_mean=first.moving_mean,
                    moving_variance=first.moving_variance, momentum=first.momentum)
            # 'first_tower' uses tower 0's shard; 'sync' tower 0's global statistics.
            updates.extend(_updates_from(first))
    return updates

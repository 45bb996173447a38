"""The moving statistics' input when the towers span several workers.

Every worker holds its own copies of the moving mean and variance, so every
worker must update them with the same bits. On one machine one tensor feeds
every copy; across workers each worker computes its own, from values all
workers share through the build's exchange (the transport is the reducer's;
this module only says what crosses):

- 'first_tower' and 'sync': the chief's tower 0 statistics (its shard, or in
  'sync' the global batch's), which the other workers receive exactly: each
  member adds them or zeros, and x + 0 is x;
- 'all_towers': every tower's (count, mean, variance), gathered in member
  order and pooled by the same formula on every worker.

With gradient accumulation each tower first pools its own micro-batches. A
layer whose moving variance is Bessel-corrected (tf_keras' fused kernel)
has it corrected with the count of the batch it stands for: by the chief
before sending, or after pooling.
"""

import tensorflow as tf

from towerlib.batchnorm.modes import resolve_bn_mode
from towerlib.batchnorm.statistics import moving_variance_input

__all__ = ["statistics_for_copies"]


def _pooled(counts, means, variances):
    """Exact (count, mean, variance) of the union: Chan's combination.

    counts [T, 1], means and variances [T, C]: rows are shards.
    """
    total = tf.reduce_sum(counts, axis=0)
    weights = counts / total
    mean = tf.reduce_sum(weights * means, axis=0)
    variance = tf.reduce_sum(weights * (variances + tf.square(means - mean)), axis=0)
    return total, mean, variance


def _own_statistics(layer_statistics, tower_index):
    """Tower `tower_index`'s (count [1], mean, variance) over its micro-batches."""
    own = [s for s in layer_statistics if s.tower_index == tower_index]
    if len(own) == 1:
        return tf.reshape(own[0].count, [1]), own[0].mean, own[0].variance
    total, mean, variance = _pooled(
        tf.stack([tf.reshape(s.count, [1]) for s in own]),
        tf.stack([s.mean for s in own]), tf.stack([s.variance for s in own]))
    return total, mean, variance


def statistics_for_copies(layer_name, layer_statistics, bn_mode, reducer):
    """Per local tower, the (mean, variance) its copy's moving average takes.

    Args:
      layer_name: the layer's scope name (names the exchange).
      layer_statistics: the layer's BatchNormStatistics of every local tower
        and micro-batch.
      bn_mode: the BatchNormMode (or its name).
      reducer: the CrossTowerReducer spanning every worker's towers.

    Returns:
      A list indexed by local tower of (mean, variance), each [C] float32,
      bit-identical on every tower of every worker.
    """
    result = []
    mode = resolve_bn_mode(bn_mode)
    unbiased = any(s.unbiased for s in layer_statistics)
    for index in range(reducer.num_towers):
        count, mean, variance = _own_statistics(layer_statistics, index)
        channels = int(mean.shape[0])
        with tf.device(reducer.devices[index]):
            if mode.pools_every_tower:
                row = tf.concat([tf.cast(count, mean.dtype), mean, variance], axis=0)
                rows = reducer.gather(row, tower_index=index,
                                      name=f"{layer_name}/moving_statistics")
                counts, means, variances = tf.split(rows, [1, channels, channels], axis=1)
                total, mean, variance = _pooled(counts, means, variances)
                variance = moving_variance_input(variance, total, unbiased)
            else:
                variance = moving_variance_input(variance, count, unbiased)
                sent = tf.concat([mean, variance], axis=0)
                if reducer.member(index) != 0:
                    sent = tf.zeros_like(sent)
                received = reducer.sum(sent, tower_index=index, differentiable=False,
                                       name=f"{layer_name}/moving_statistics")
                mean, variance = received[:channels], received[channels:]
        result.append((mean, variance))
    return result

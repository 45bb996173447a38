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

from towerlib.batchnorm.statistics import moving_variance_input

__all__ = ["chiefs_rows", "from_chiefs_rows", "statistics_for_layers"]


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


def statistics_for_layers(layers, bn_mode, reducer):
    """Per layer and local tower, the (mean, variance) its copy's moving average takes.

    Every layer's values cross in ONE exchange per local tower (the reducer
    packs a list into one collective): a ResNet-20's 21 layers cost one
    round trip between the workers a step, not 21.

    Args:
      layers: {layer name: its BatchNormStatistics of every local tower and
        micro-batch}.
      bn_mode: the BnMode.
      reducer: the CrossTowerReducer spanning every worker's towers.

    Returns:
      {layer name: a list indexed by local tower of (mean, variance), each [C]
      float32, bit-identical on every tower of every worker}.
    """
    names = list(layers)
    result = {name: [] for name in names}
    for index in range(reducer.num_towers):
        own = [_own_statistics(layers[name], index) for name in names]
        unbiased = [any(s.unbiased for s in layers[name]) for name in names]
        with tf.device(reducer.devices[index]):
            exchange = _pooled_everywhere if bn_mode.pools_every_tower else _the_chiefs
            shared = exchange(own, unbiased, reducer, index)
        for name, statistics in zip(names, shared):
            result[name].append(statistics)
    return result


def _pooled_everywhere(own, unbiased, reducer, index):
    """'all_towers': every tower's (count, mean, variance), gathered, pooled alike."""
    rows = [tf.concat([tf.cast(count, mean.dtype), mean, variance], axis=0)
            for count, mean, variance in own]
    gathered = reducer.gather(rows, tower_index=index, name="moving_statistics")
    shared = []
    for (_, mean, _), layer_rows, correct in zip(own, gathered, unbiased):
        channels = int(mean.shape[0])
        counts, means, variances = tf.split(layer_rows, [1, channels, channels], axis=1)
        total, mean, variance = _pooled(counts, means, variances)
        shared.append((mean, moving_variance_input(variance, total, correct)))
    return shared


def _the_chiefs(own, unbiased, reducer, index):
    """'first_tower' and 'sync': the chief's tower 0 values; the others add zeros."""
    sent = _chiefs_values(own, unbiased, reducer.member(index) == 0)
    received = reducer.sum(sent, tower_index=index, differentiable=False,
                           name="moving_statistics")
    return [(values[:int(mean.shape[0])], values[int(mean.shape[0]):])
            for values, (_, mean, _) in zip(received, own)]


def _chiefs_values(own, unbiased, is_chief):
    """Per layer [mean; moving-variance input] of this tower, or zeros off the chief."""
    sent = [tf.concat([mean, moving_variance_input(variance, count, correct)], axis=0)
            for (count, mean, variance), correct in zip(own, unbiased)]
    return sent if is_chief else [tf.zeros_like(values) for values in sent]


def chiefs_rows(layers, bn_mode, reducer):
    """Per local tower, ONE float32 vector that a sum over every tower of every worker
    turns into every layer's [mean; moving-variance input] of the chief's tower 0 (the
    other members send zeros, and x + 0 is x). For 'first_tower' and 'sync', to be
    carried by another exchange (towerlib.step.across_workers); None for 'all_towers',
    which gathers every tower's (statistics_for_layers).
    """
    if bn_mode.pools_every_tower or not layers:
        return None
    names = list(layers)
    rows = []
    for index in range(reducer.num_towers):
        own = [_own_statistics(layers[name], index) for name in names]
        unbiased = [any(s.unbiased for s in layers[name]) for name in names]
        with tf.device(reducer.devices[index]):
            values = _chiefs_values(own, unbiased, reducer.member(index) == 0)
            rows.append(tf.concat([tf.cast(v, tf.float32) for v in values], axis=0))
    return rows


def from_chiefs_rows(layers, summed_rows):
    """{layer name: per local tower (mean, variance)} from chiefs_rows' summed vectors."""
    names = list(layers)
    channels = [int(layers[name][0].mean.shape[0]) for name in names]
    dtypes = [layers[name][0].mean.dtype for name in names]
    result = {name: [] for name in names}
    for row in summed_rows:
        with tf.device(row.device):
            pieces = tf.split(row, [2 * c for c in channels], axis=0)
            for name, piece, c, dtype in zip(names, pieces, channels, dtypes):
                piece = tf.cast(piece, dtype)
                result[name].append((piece[:c], piece[c:]))
    return result

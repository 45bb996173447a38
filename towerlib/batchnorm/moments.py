"""Batch-norm statistics and gradients as plain functions of per-channel tensors.

The training layer (towerlib.batchnorm.normalization) composes these; each is
tested alone against float64 numpy (tests/batchnorm/test_moments.py). Shapes:
x is any rank with channels on `channel_axis`; C is the channel count; every
per-channel result is [C]; T is the number of towers.

Why a pivot. A shard's mean travels as hi + lo: hi is the shard's first
value per channel (a pivot found at no pass over the data) and lo = mean(x -
hi), a small offset exact to float32's relative precision; M2, the sum of
squared deviations, is taken around hi + lo. Combining the shards around a
common pivot P (Chan's parallel formula):

    n    = sum_i n_i,      e_i = (hi_i - P) + lo_i,      E = sum_i (n_i / n) e_i
    mean = P + E,          M2  = sum_i M2_i + sum_i n_i (e_i - E)^2,   var = M2 / n

keeps every term a sum of squares (the variance is never negative) and no
square of a raw value is formed, so nothing cancels even at a mean of 1e4.
Worked example, one channel, two shards [1, 3] and [5]: hi = (1, 5), lo =
(1, 0), M2 = (2, 0), P = (2*1 + 1*5) / 3 = 7/3, e = (-1/3, 8/3), E = 2/3,
mean = 3, M2 = 2 + 2*(1)^2 + 1*(2)^2 = 8, variance = 8/3.
"""

import tensorflow as tf

__all__ = ["ChannelBroadcast", "ShardSummary", "combine_summaries", "input_gradient",
           "local_gradient_sums", "normalize_from_summary", "per_example", "shard_summary",
           "static_count"]


class ChannelBroadcast:
    """Makes a [C] vector broadcast against x (channels-last needs nothing)."""

    def __init__(self, rank, channel_axis, channels):
        self._shape = (None if channel_axis == rank - 1
                       else [channels] + [1] * (rank - 1 - channel_axis))

    def __call__(self, per_channel):
        return per_channel if self._shape is None else tf.reshape(per_channel, self._shape)


def static_count(x, axes):
    """Examples x positions of x, when its shape fixes them; else None."""
    sizes = [x.shape[a] for a in axes]
    if any(size is None for size in sizes):
        return None
    count = 1
    for size in sizes:
        count *= int(size)
    return count


def per_example(total, count, known_count):
    """total / count; 0 for an empty shard (which then weighs nothing).

    `known_count` is the static count (a Python int) or None, when `count`
    (a float scalar tensor) is used instead.
    """
    if known_count is None:
        return tf.math.divide_no_nan(total, count)
    return total * (1.0 / known_count if known_count else 0.0)


class ShardSummary:
    """One shard's statistics: (hi, lo, m2), each [C], and x - hi (shaped like x)."""

    def __init__(self, hi, lo, m2, deviation):
        self.hi, self.lo, self.m2, self.deviation = hi, lo, m2, deviation


def shard_summary(x, axes, broadcast, count, known_count):
    """The pivot hi, mean offset lo and M2 of one shard (float32 or float64 x).

    hi is the shard's first value per channel (0 for an empty shard), lo the
    mean of x - hi, and M2 the sum of squared deviations from hi + lo.
    """
    first = x[tuple(slice(0, 1) if a in axes else slice(None)
                    for a in range(x.shape.rank))]  # empty-safe
    hi = tf.reduce_sum(first, axes)
    deviation = x - broadcast(hi)
    lo = per_example(tf.reduce_sum(deviation, axes), count, known_count)
    m2 = tf.reduce_sum(tf.math.squared_difference(deviation, broadcast(lo)), axes)
    return ShardSummary(hi, lo, m2, deviation)


def combine_summaries(counts, his, los, m2s, own_hi):
    """(total, mean, variance, mean - own_hi) of T shards combined.

    Args:
      counts: [T, 1] the shards' example counts (0 for an empty shard).
      his, los, m2s: [T, C] each shard's hi, lo and M2 (shard_summary).
      own_hi: [C], this tower's hi, for mean - hi in small differences.

    The combination is symmetric in the shards, so any row order gives the
    same result up to float addition order (every tower passes the same rows).
    """
    total = tf.reduce_sum(counts)
    weights = tf.math.divide_no_nan(counts, total)  # [T, 1]
    pivot = tf.reduce_sum(weights * his, axis=0)
    offsets = (his - pivot) + los  # e_i
    mean_offset = tf.reduce_sum(weights * offsets, axis=0)  # E
    m2_total = tf.reduce_sum(m2s + counts * tf.square(offsets - mean_offset), axis=0)
    variance = tf.math.divide_no_nan(m2_total, total)
    # mean - hi = (P - hi) + E is formed from small differences.
    return total, pivot + mean_offset, variance, (pivot - own_hi) + mean_offset


def normalize_from_summary(deviation, mean_minus_hi, variance, scale, offset, epsilon,
                           broadcast):
    """(y, k, inverse_std): y = (x - hi) k + (offset - (mean - hi) k).

    k = scale / sqrt(variance + epsilon). Formed from x - hi rather than x,
    y keeps its precision where x * k would be a large number.
    """
    inverse_std = tf.math.rsqrt(variance + epsilon)
    k = inverse_std * scale
    y = deviation * broadcast(k) + broadcast(offset - mean_minus_hi * k)
    return y, k, inverse_std


def local_gradient_sums(grad_y, deviation, inverse_std, mean_minus_hi, axes):
    """(sum g, sum g * x_hat) over this shard, each [C].

    x_hat = (x - mean) * inverse_std = ((x - hi) - (mean - hi)) * inverse_std.
    """
    sum_g = tf.reduce_sum(grad_y, axes)
    sum_g_deviation = tf.reduce_sum(grad_y * deviation, axes)
    return sum_g, inverse_std * (sum_g_deviation - mean_minus_hi * sum_g)


def input_gradient(grad_y, deviation, k, inverse_std, mean_minus_hi, batch_sums, total,
                   broadcast):
    """The batch-norm gradient with respect to x, with the batch's sums.

        dx = k * (g - sum(g) / n - x_hat * sum(g * x_hat) / n)
           = k g + a (x - hi) + c,   a = -k inverse_std mean(g x_hat),
                                     c = -k mean(g) - a (mean - hi)

    Args:
      batch_sums: [2C], the concatenated sum(g) and sum(g * x_hat) over the
        batch the statistics cover (the shard's, or every tower's added up).
      total: the examples x positions that batch holds.
    """
    mean_g, mean_g_x_hat = tf.split(batch_sums * tf.math.divide_no_nan(1.0, total), 2)
    a = -k * inverse_std * mean_g_x_hat
    c = -k * mean_g - a * mean_minus_hi
    return grad_y * broadcast(k) + (deviation * broadcast(a) + broadcast(c))

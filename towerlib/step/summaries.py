"""Tower-aware scalar summaries.

A summary written inside a tower would be tagged 'tower_3/accuracy' and exist
once per tower. `tower_scalar` instead records the value; the builder writes
one summary per name, without the tower prefix, holding the mean over the
global batch (each tower weighted by its share of examples).
"""

import re

import tensorflow as tf

_TOWER_PREFIX = re.compile(r"(^|/)tower_\d+/")


def strip_tower_prefix(name):
    """'tower_2/loss/xent' -> 'loss/xent'."""
    return _TOWER_PREFIX.sub(r"\1", name)


def scalar_summary(tag, value, collections=None):
    """A scalar summary tagged exactly `tag`.

    tf.compat.v1.summary.scalar derives the tag from a unique op name, so a
    second 'learning_rate' op in the graph would turn the tag into
    'learning_rate_1' and split the TensorBoard curve.
    """
    with tf.name_scope("summaries"):
        summary = tf.raw_ops.ScalarSummary(
            tags=tf.constant(tag), values=tf.cast(value, tf.float32))
    for collection in collections or [tf.compat.v1.GraphKeys.SUMMARIES]:
        tf.compat.v1.add_to_collection(collection, summary)
    return summary


def tower_scalar(ctx, name, value):
    """Records a per-tower scalar (say accuracy) for one merged summary.

    Args:
      ctx: the TowerContext.
      name: summary tag, without any tower prefix.
      value: a scalar tensor computed from this tower's examples.
    """
    value = tf.convert_to_tensor(value)
    if value.shape.rank not in (None, 0):
        raise ValueError(f"tower_scalar {name!r} needs a scalar, got shape {value.shape}.")
    if ctx.records is None:
        scalar_summary(strip_tower_prefix(name), value)
    else:
        ctx.records.add_scalar(strip_tower_prefix(name), (ctx.micro_batch, ctx.index), value)


def merge_tower_scalars(records, tower_shares, collections=None):
    """Writes each recorded scalar once, weighted by the towers' shares.

    Args:
      records: the build's TowerRecords.
      tower_shares: {(micro-batch, tower index): float32 scalar}, each
        micro-batch tower's fraction of the global batch (summing to 1).

    Returns:
      {name: merged scalar tensor}.
    """
    merged = {}
    for name, values in records.scalars.items():
        shares = [tower_shares[key] for key, _ in values]
        total_share = tf.add_n(shares)
        merged[name] = tf.add_n(
            [share * tf.cast(value, tf.float32) for share, (_, value) in zip(shares, values)]
        ) / total_share
        scalar_summary(name, merged[name], collections=collections)
    return merged

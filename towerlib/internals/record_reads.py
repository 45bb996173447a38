"""One TFRecord read at a byte offset, by tf.data ops alone.

`tf.data.TFRecordDataset` (TF 2.21) reads each file from its start. The op
beneath a newer variant, `tf.raw_ops.TFRecordDatasetV2`, takes
`byte_offsets`: it seeks (one positioned read, not a read through the
skipped bytes, unlike `FixedLengthRecordDataset`'s `header_bytes`) and
reads records from there, checking each one's length and payload CRC-32C as
`TFRecordDataset` does. No public class wraps it, so this module makes a
dataset of its variant with `tf.data.experimental.from_variant`.

Only inside a tf.data function (a `flat_map` or `interleave`): the op's
graph serialization drops `byte_offsets` (TF 2.21), which tf.data's
rewrites of a top-level dataset need; inside a function the dataset is
built when it runs and never serialized. tests/internals/test_internals.py
fails by name if a release changes what this module relies on.
"""

import tensorflow as tf

__all__ = ["tfrecord_at"]

_RECORD = tf.TensorSpec([], tf.string)
# A record's framing: its length (8 bytes) and the length's CRC (4) before the
# payload, the payload's CRC (4) after.
FRAMING_BYTES = 16


def tfrecord_at(filename, offset, length):
    """A dataset of the one record (tf.string payload) that starts at `offset`.

    Args:
      filename: tf.string scalar, the file.
      offset: int64 scalar, the byte offset of the record's length header.
      length: int64 scalar, the payload's bytes (the read buffer is sized to
        the whole record, so one positioned read fetches it).
    """
    variant = tf.raw_ops.TFRecordDatasetV2(
        filenames=tf.reshape(filename, [1]), compression_type="",
        buffer_size=tf.cast(length, tf.int64) + FRAMING_BYTES,
        byte_offsets=tf.reshape(tf.cast(offset, tf.int64), [1]))
    return tf.data.experimental.from_variant(variant, _RECORD).take(1)

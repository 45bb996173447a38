"""The sources global_batch_input reads by example index, each with its identity.

    towerlib.TFRecords("/data/imagenet/train-*", decode=parse_example)
    towerlib.FixedLengthRecords("/data/cifar10/data_batch_*.bin", 3073, decode)

Every source has `num_examples` (n) and `fingerprint`, an int64 that changes
when the data does (saved in every checkpoint and compared across workers).
A record source builds, in the graph, `record_reader()`: a function of an
int64 example index giving that record's bytes through tf.data ops, with no
Python in the read path and no file held in memory:

- TFRecords: the shard and the offset come from the shards' indices (8
  bytes a record, read from the index files when the iterator starts), and
  one positioned read fetches the record, its CRCs checked by TensorFlow's
  reader (towerlib/internals/record_reads.py).
- FixedLengthRecords: the file and offset come from the record's number;
  `tf.data.FixedLengthRecordDataset` reads it. That reader skips to the
  offset by reading through the bytes before it (into a 256 KB buffer, so
  memory stays bounded but a read costs time in proportion to its offset
  in the file); `in_memory=True` loads the files once per process instead.
"""

import dataclasses
import functools
import hashlib
import json
import os
from typing import Any, Callable, Optional

import numpy as np
import tensorflow as tf

from towerlib.checks import data_checks
from towerlib.data import tfrecord_index
from towerlib.internals import record_reads

__all__ = ["ArraySource", "FixedLengthRecords", "TFRecords", "as_source"]

# FixedLengthRecordDataset's read buffer: the bytes before a record pass through it.
_FIXED_LENGTH_BUFFER = 256 * 1024


def _fingerprint(parts):
    """An int64 (as a Python int) from a JSON-able description."""
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).digest()
    return int.from_bytes(digest[:8], "little", signed=True)


def _shard_of(first, example):
    """int32 scalar: the file holding `example`, given each file's first example."""
    return tf.searchsorted(first, tf.reshape(example, [1]), side="right")[0] - 1


@dataclasses.dataclass(frozen=True, eq=False)
class TFRecords:
    """TFRecord shards read by index (the shards in the order given; globs sorted).

    Attributes:
      files: a file, a directory (its files), a glob pattern or a list of them.
      decode: record (a tf.string scalar: one serialized record, e.g. a
        tf.train.Example) -> one example, a nest of tensors; None gives the
        record's bytes.
      index_dir: where the shards' index files go; None: beside each shard.

    Building the index (once per shard, on first use) reads each record's
    12 header bytes and checks the length's CRC; a truncated or corrupt
    shard is refused in one line naming it and the offset. Reads check each
    record's length and payload CRC-32C (TensorFlow's TFRecord reader raises
    DataLossError "corrupted record at <offset>").
    """

    files: Any
    decode: Optional[Callable] = None
    index_dir: Any = None

    @functools.cached_property
    def shards(self):
        """[ShardIndex], one per file, in order."""
        paths, problems = data_checks.expand_paths(self.files)
        if problems:
            raise data_checks.DataError(f"TFRecords: {problems[0]}")
        paths = [p for p in paths if not p.endswith(tfrecord_index.SUFFIX)
                 and ".partial-" not in p]
        return [tfrecord_index.shard_index(p, self.index_dir) for p in paths]

    @property
    def num_examples(self):
        return sum(shard.records for shard in self.shards)

    @functools.cached_property
    def fingerprint(self):
        return _fingerprint([[os.path.basename(s.path), s.records, s.size,
                              hashlib.sha256(s.offsets.tobytes()).hexdigest()]
                             for s in self.shards])

    def record_reader(self):
        """example (int64 scalar) -> its record (tf.string scalar). Call in the graph."""
        shards = self.shards
        words = tfrecord_index.HEADER_WORDS
        read = [tf.io.decode_raw(tf.io.read_file(s.index_path), tf.int64) for s in shards]
        found = tf.stack([w[2:4] for w in read])
        expected = tf.constant([[s.size, s.mtime_ns] for s in shards], tf.int64)
        check = tf.debugging.assert_equal(found, expected, message=(
            "TFRecords: a shard's index file changed after the graph was built (the "
            "shard was rewritten). Fix: rebuild the graph (restart the run)"))
        with tf.control_dependencies([check]):
            # Record i of the whole source spans [bounds[i + s], bounds[i + s + 1]) of
            # its shard s: each shard's offsets, then its size.
            bounds = tf.concat([w[words:words + s.records + 1]
                                for w, s in zip(read, shards)], axis=0)
        first = tf.constant(np.cumsum([0] + [s.records for s in shards[:-1]]), tf.int64)
        names = tf.constant([s.path for s in shards])

        def record(example):
            shard = tf.cast(_shard_of(first, example), tf.int64)
            start = tf.gather(bounds, example + shard)
            end = tf.gather(bounds, example + shard + 1)
            return record_reads.tfrecord_at(
                tf.gather(names, shard), start,
                end - start - record_reads.FRAMING_BYTES).get_single_element()
        return record


@dataclasses.dataclass(frozen=True, eq=False)
class FixedLengthRecords:
    """Record files of equal-size records, read by index (e.g. CIFAR-10's binary files).

    Attributes:
      paths: a file, a directory, a glob pattern or a list of them (checked
        by towerlib.check_record_files: every size a multiple of record_bytes).
      record_bytes: bytes per record (CIFAR-10: 3073).
      decode: record (a tf.string scalar of record_bytes bytes) -> one example,
        a nest of tensors (e.g. (image uint8 [32, 32, 3], label int32 [])).
      in_memory: False (default): each record is read from its file at its
        offset, memory bounded whatever the files' size; a read passes the
        bytes before it in its file through a 256 KB buffer (files of a few
        MB keep that short). True: every file is loaded once per process
        (CIFAR-10's training files: 154 MB), the fastest for small data.
    """

    paths: Any
    record_bytes: int
    decode: Callable
    in_memory: bool = False

    def __post_init__(self):
        object.__setattr__(self, "record_bytes", data_checks.check_record_bytes(
            self.record_bytes))

    @functools.cached_property
    def files(self):
        """RecordFiles: the files in order, and their record counts."""
        return data_checks.check_record_files(self.paths, self.record_bytes)

    @property
    def num_examples(self):
        return self.files.total_records

    @functools.cached_property
    def fingerprint(self):
        return _fingerprint([self.record_bytes, [[os.path.basename(p), r] for p, r in zip(
            self.files.paths, self.files.records)]])

    def load(self):
        """uint8 [records, record_bytes]: every record of every file, in file order."""
        parts = [np.fromfile(path, np.uint8).reshape([-1, self.record_bytes])
                 for path in self.files.paths]
        return np.concatenate(parts, axis=0)

    def record_reader(self):
        """example (int64 scalar) -> its record (tf.string scalar). Call in the graph."""
        counts = self.files.records
        first = tf.constant(np.cumsum([0] + counts[:-1]), tf.int64)
        sizes = tf.constant([c * self.record_bytes for c in counts], tf.int64)
        names = tf.constant(self.files.paths)
        record_bytes = self.record_bytes

        def record(example):
            shard = _shard_of(first, example)
            offset = (example - tf.gather(first, shard)) * record_bytes
            dataset = tf.data.FixedLengthRecordDataset(
                tf.reshape(tf.gather(names, shard), [1]), record_bytes,
                header_bytes=offset,
                footer_bytes=tf.gather(sizes, shard) - offset - record_bytes,
                buffer_size=_FIXED_LENGTH_BUFFER)
            return dataset.take(1).get_single_element()
        return record


@dataclasses.dataclass(frozen=True, eq=False)
class ArraySource:
    """A nest of numpy arrays sharing dimension 0 (the examples), held in memory."""

    arrays: Any

    @property
    def num_examples(self):
        return int(tf.nest.flatten(self.arrays)[0].shape[0])

    @functools.cached_property
    def fingerprint(self):
        digest = hashlib.sha256()
        for array in tf.nest.flatten(self.arrays):
            digest.update(f"{array.dtype.str}{array.shape}".encode())
            digest.update(np.ascontiguousarray(array).data)
        return _fingerprint(digest.hexdigest())


def as_source(source):
    """source as an ArraySource, TFRecords or FixedLengthRecords; TypeError/ValueError
    (one line) for anything else."""
    if isinstance(source, (TFRecords, FixedLengthRecords)):
        return source
    flat = tf.nest.flatten(source)
    if not flat or not all(isinstance(a, np.ndarray) and a.ndim >= 1 for a in flat):
        raise TypeError(
            "global_batch_input: source must be a nest of numpy arrays with a leading "
            "example dimension (e.g. (images, labels)), a towerlib.TFRecords or a "
            f"towerlib.FixedLengthRecords; got {type(source).__name__}.")
    counts = {a.shape[0] for a in flat}
    if len(counts) > 1:
        raise ValueError(f"global_batch_input: the source's arrays disagree on the number "
                         f"of examples (dimension 0): {sorted(counts)}.")
    return ArraySource(source)

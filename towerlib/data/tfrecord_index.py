"""The record index of a TFRecord shard: where each record starts, built from its headers.

A TFRecord record is its length (8 bytes, little-endian), the length's
masked CRC-32C (4), the payload, the payload's masked CRC-32C (4). Building
the index reads the 12 header bytes of each record, checks the length's CRC
and seeks past the payload: a shard of 110 KB records is read at about
1/9000 of its bytes.

The index is one small file per shard, kept beside it (`<shard>.towerlib-
index`) or in `index_dir` (named by the shard's name and a hash of its
path): little-endian int64s, [magic, version, shard size, shard mtime (ns),
records, the records' offsets..., shard size]. The offsets then the size
bound every record: record i spans [offset_i, offset_(i+1)), so 8 bytes a
record give both its place and its length. An index whose size or mtime no
longer match the shard's is rebuilt (one log line); a file of that name that
towerlib did not write is refused, never overwritten.
"""

import dataclasses
import hashlib
import logging
import os
import struct

import numpy as np
import tensorflow as tf

from towerlib.checks.data_checks import DataError
from towerlib.data.crc32c import masked_crc32c

__all__ = ["HEADER_WORDS", "SUFFIX", "ShardIndex", "shard_index"]

logger = logging.getLogger("towerlib")

_MAGIC = int(np.frombuffer(b"TLRECIDX", "<i8")[0])
_VERSION = 1
# int64 words before the offsets: magic, version, size, mtime, records.
HEADER_WORDS = 5
SUFFIX = ".towerlib-index"


@dataclasses.dataclass(frozen=True)
class ShardIndex:
    """One shard's index.

    Attributes:
      path: the shard.
      index_path: its index file.
      size, mtime_ns: the shard's, when the index was built.
      offsets: int64 [records], each record's first byte (its length header).
    """

    path: str
    index_path: str
    size: int
    mtime_ns: int
    offsets: np.ndarray

    @property
    def records(self):
        return int(self.offsets.shape[0])


def index_path_of(shard, index_dir=None):
    """Where `shard`'s index lives: beside it, or in index_dir."""
    if index_dir is None:
        return shard + SUFFIX
    digest = hashlib.sha256(os.path.abspath(shard).encode()).hexdigest()[:10]
    return os.path.join(os.fspath(index_dir), f"{os.path.basename(shard)}.{digest}{SUFFIX}")


def shard_index(shard, index_dir=None):
    """The shard's ShardIndex: read from its index file if that still matches the
    shard (size and mtime), else built from the headers and written.

    Raises:
      DataError (one line): the shard is truncated or its headers are corrupt
        (naming the shard and the offset), or the index cannot be written.
    """
    stat = tf.io.gfile.stat(shard)
    index_path = index_path_of(shard, index_dir)
    words = _read_index(index_path)
    if words is not None:
        if words[2] == stat.length and words[3] == stat.mtime_nsec:
            offsets = words[HEADER_WORDS:HEADER_WORDS + int(words[4])].copy()
            return ShardIndex(shard, index_path, stat.length, stat.mtime_nsec, offsets)
        logger.info("TFRecords: %s changed since its index was built (%d bytes then, %d "
                    "now, or a newer modification time); rebuilding the index.",
                    shard, words[2], stat.length)
    offsets = scan_shard(shard, stat.length)
    _write_index(index_path, shard, stat.length, stat.mtime_nsec, offsets)
    return ShardIndex(shard, index_path, stat.length, stat.mtime_nsec, offsets)


def _open(path):
    return tf.io.gfile.GFile(path, "rb") if "://" in path else open(path, "rb")


def scan_shard(shard, size):
    """int64 [records]: each record's offset, from its header (payloads skipped)."""
    offsets = []
    offset = 0
    with _open(shard) as file:
        while offset < size:
            file.seek(offset)
            header = file.read(12)
            if len(header) < 12:
                _truncated(shard, offset, 12, size)
            length, crc = struct.unpack("<QI", header)
            if masked_crc32c(header[:8]) != crc:
                raise DataError(
                    f"TFRecords: {shard} is corrupt at offset {offset}: the record's "
                    "length header fails its CRC-32C (a damaged shard, or not a "
                    "TFRecord file). Fix: copy or generate the shard again, or leave "
                    "it out of the files.")
            if offset + 16 + length > size:
                _truncated(shard, offset, 16 + length, size)
            offsets.append(offset)
            offset += 16 + length
    return np.asarray(offsets, np.int64)


def _truncated(shard, offset, needed, size):
    raise DataError(
        f"TFRecords: {shard} is truncated at offset {offset}: the record there needs "
        f"{needed} bytes and the file ends at {size}. Fix: copy or generate the "
        "shard again (an interrupted copy or write leaves this).")


def _read_index(index_path):
    """The index file's int64 words, None if there is none; refuses a foreign file."""
    if not tf.io.gfile.exists(index_path):
        return None
    with tf.io.gfile.GFile(index_path, "rb") as file:
        data = file.read()
    words = np.frombuffer(data[:len(data) - len(data) % 8], "<i8")
    if len(words) < HEADER_WORDS or words[0] != _MAGIC:
        raise DataError(
            f"TFRecords: {index_path} is where the shard's index belongs, and it is not "
            "an index towerlib wrote; towerlib never overwrites a file it did not write. "
            "Fix: move that file away, or give index_dir= another folder.")
    if words[1] != _VERSION or len(words) != HEADER_WORDS + int(words[4]) + 1:
        return np.asarray([_MAGIC, _VERSION, -1, -1, 0, 0], np.int64)  # rebuilt
    return words


def _write_index(index_path, shard, size, mtime_ns, offsets):
    words = np.concatenate([[_MAGIC, _VERSION, size, mtime_ns, len(offsets)], offsets,
                            [size]]).astype("<i8")
    partial = f"{index_path}.partial-{os.getpid()}"
    try:
        folder = os.path.dirname(index_path)
        if folder:
            tf.io.gfile.makedirs(folder)
        with tf.io.gfile.GFile(partial, "wb") as file:
            file.write(words.tobytes())
        tf.io.gfile.rename(partial, index_path, overwrite=True)
    except (OSError, tf.errors.OpError) as error:
        raise DataError(
            f"TFRecords: cannot write the index of {shard} at {index_path} "
            f"({type(error).__name__}: {str(error).splitlines()[0]}). Fix: give index_dir= "
            "a writable folder.") from None

"""Checks that make bad input data fail loudly, naming the file or the value.

Two kinds: host-side checks of input files before a pipeline is built
(`check_record_files`: missing files, empty directories, files whose size
is not a whole number of fixed-length records, i.e. truncated or in another
format), and in-graph assertions on a batch (`assert_labels_in_range`,
`assert_finite`) whose failure stops the step before any update, since the
train op depends on the checked tensor.

Dataset readers (e.g. the CIFAR-10 example's) do their own format-specific
checks and word their own errors; `record_file_size` gives them the generic
size check that `check_record_files` applies.
"""

import dataclasses
import numbers
import os
from typing import List

import tensorflow as tf


class DataError(ValueError):
    """Input files that cannot give a correct result; the message names each one."""


@dataclasses.dataclass(frozen=True)
class RecordFiles:
    """What `check_record_files` found: the files, in order, and their record counts."""

    paths: List[str]
    records: List[int]

    @property
    def total_records(self):
        return sum(self.records)


@dataclasses.dataclass(frozen=True)
class RecordFileSize:
    """A file's size counted in fixed-length records (see `record_file_size`).

    Attributes:
      size: the file's length in bytes.
      records: the whole records between the header and the footer.
      leftover: the bytes after the last whole record; negative when the file
        is shorter than the header and footer together.
    """

    size: int
    records: int
    leftover: int

    @property
    def is_whole(self):
        """True when the file is header, whole records and footer, nothing else.

        An empty file is not: it is a failed download or copy, never data.
        """
        return self.size > 0 and self.leftover == 0


def check_record_bytes(record_bytes):
    """record_bytes as an int (numpy's too); anything but a whole number >= 1 refused."""
    if isinstance(record_bytes, bool) or not isinstance(record_bytes, numbers.Integral):
        raise TypeError(f"record_bytes must be an int, the bytes of one record, got "
                        f"{record_bytes!r} ({type(record_bytes).__name__}). Fix: e.g. "
                        "record_bytes=3073 for CIFAR-10.")
    if record_bytes < 1:
        raise ValueError(f"record_bytes must be >= 1, got {record_bytes}.")
    return int(record_bytes)


def record_file_size(path, record_bytes, *, header_bytes=0, footer_bytes=0):
    """How one existing file's size splits into fixed-length records.

    The size check of `check_record_files`, for a reader that checks its own
    files and words its own errors: `is_whole` is False for exactly the
    files that `check_record_files` reports as empty or truncated.

    Args:
      path: an existing file (not a directory or a pattern).
      record_bytes, header_bytes, footer_bytes: as for `check_record_files`.

    Returns:
      A RecordFileSize.
    """
    check_record_bytes(record_bytes)
    size = tf.io.gfile.stat(os.fspath(path)).length
    body = size - header_bytes - footer_bytes
    records, leftover = divmod(body, record_bytes) if body >= 0 else (0, body)
    return RecordFileSize(size, records, leftover)


def _expand(paths):
    """Files from a directory, a glob pattern, a path, or a list of those."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    found, problems = [], []
    if not paths:
        problems.append(f"no file given ({paths!r}). Fix: a file, a directory, a glob "
                        "pattern or a list of them.")
    for entry in paths:
        entry = os.fspath(entry)
        if tf.io.gfile.isdir(entry):
            names = sorted(n for n in tf.io.gfile.listdir(entry)
                           if not tf.io.gfile.isdir(os.path.join(entry, n)))
            if not names:
                problems.append(f"{entry}: the directory is empty (no data files). "
                                "Fix: download or generate the data into it, or point "
                                "to the right directory.")
            found.extend(os.path.join(entry, n) for n in names)
        elif any(c in entry for c in "*?["):
            matches = sorted(tf.io.gfile.glob(entry))
            if not matches:
                problems.append(f"{entry}: no file matches this pattern. Fix: check the "
                                "path and that the data was downloaded.")
            found.extend(matches)
        elif not tf.io.gfile.exists(entry):
            problems.append(f"{entry}: the file does not exist. Fix: check the path, "
                            "or download the data again.")
        else:
            found.append(entry)
    return found, problems


def expand_paths(paths):
    """(the files a directory, glob pattern, path or list of them names, in order;
    a line for each entry that names none)."""
    return _expand(paths)


def check_record_files(paths, record_bytes, *, header_bytes=0, footer_bytes=0,
                       min_records=1):
    """Checks fixed-length-record files by size, before anything reads them.

    A file of `header_bytes + k * record_bytes + footer_bytes` bytes holds k
    records. Any other size means the file is truncated, padded, or not in
    this format. `tf.data.FixedLengthRecordDataset` (TF 2.21) raises for such
    a file only when it reaches it, possibly hours into training, and reads
    an empty file (or one holding only the header) as zero records without
    any error. This checks every file before anything is built and reports
    all the bad ones together, each with its size and leftover bytes.

    Args:
      paths: a file, a directory (its files), a glob pattern, or a list of them.
      record_bytes: bytes per record (e.g. CIFAR-10: 1 + 32 * 32 * 3 = 3073).
      header_bytes, footer_bytes: fixed bytes before / after the records.
      min_records: the fewest records a file may hold.

    Returns:
      RecordFiles(paths, records per file).

    Raises:
      DataError: listing every bad file, each with the fix.
    """
    check_record_bytes(record_bytes)
    files, problems = _expand(paths)
    if not files and problems and not paths:
        raise DataError(problems[0][0].upper() + problems[0][1:])
    records = []
    for path in files:
        found = record_file_size(path, record_bytes, header_bytes=header_bytes,
                                 footer_bytes=footer_bytes)
        if found.size == 0:
            problems.append(f"{path}: the file is empty (0 bytes). Fix: download or "
                            "generate it again.")
        elif not found.is_whole:
            problems.append(
                f"{path}: {found.size} bytes is not {header_bytes} header + a whole "
                f"number of {record_bytes}-byte records + {footer_bytes} footer "
                f"({found.records} records and {found.leftover} bytes left over): the "
                "file is truncated or not in this format. Fix: download or generate it "
                "again, or check record_bytes.")
        elif found.records < min_records:
            problems.append(f"{path}: holds {found.records} records, fewer than "
                            f"{min_records}. Fix: download or generate it again.")
        records.append(found.records)
    if problems:
        if len(problems) == 1:
            raise DataError(f"Bad input file {problems[0]}")
        raise DataError(f"{len(problems)} bad input files:\n"
                        + "\n".join(f"  - {p}" for p in problems))
    return RecordFiles(files, records)


def assert_labels_in_range(labels, num_classes, name="labels"):
    """`labels` unchanged, but the step fails if any is outside [0, num_classes).

    Sparse softmax cross entropy on CPU raises for such labels, but on GPU it
    returns NaN losses, and one-hot encodings silently give zero rows: a
    corrupt label file trains on garbage. The error names the tensor, the
    range and the smallest and largest label seen.

    Args:
      labels: integer tensor of any shape, e.g. [batch].
      num_classes: python int.
    """
    labels = tf.convert_to_tensor(labels)
    if not labels.dtype.is_integer:
        raise TypeError(f"{name} must be an integer tensor, got {labels.dtype.name}.")
    with tf.name_scope(f"check_{name}"):
        low = tf.reduce_min(labels)
        high = tf.reduce_max(labels)
        in_range = tf.logical_and(tf.greater_equal(low, 0),
                                  tf.less(high, tf.cast(num_classes, labels.dtype)))
        check = tf.debugging.Assert(
            tf.logical_or(tf.equal(tf.size(labels), 0), in_range),
            [f"{name} must be in [0, {num_classes}); the data is corrupt or num_classes "
             "is wrong. Smallest and largest label in this batch:", low, high])
        with tf.control_dependencies([check]):
            return tf.identity(labels)


def assert_finite(tensor, name):
    """`tensor` unchanged, but the step fails naming `name` if it holds NaN or Inf."""
    return tf.debugging.check_numerics(
        tensor, f"{name} holds NaN or Inf: the input data is corrupt")

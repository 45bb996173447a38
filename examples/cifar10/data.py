"""The CIFAR-10 binary data set on disk: its format, its validation, its tf.data reader.

The binary release (``cifar-10-binary.tar.gz``) unpacks to a folder
``cifar-10-batches-bin/`` holding ``data_batch_1.bin`` ... ``data_batch_5.bin`` (training,
10000 records each) and ``test_batch.bin`` (10000 records). Every record is
``RECORD_BYTES = 1 + 3072`` bytes: one label byte (0..9), then the image as uint8 in
depth-major order ``[3, 32, 32]`` (all red rows, then all green, then all blue).

The files are validated *before* any graph is built (their sizes by towerlib's
``data_checks.record_file_size``, their labels with numpy), so that a wrong folder or a
truncated download is reported as one clear error naming the file and the fix, not as an
``OutOfRangeError`` or a silently short epoch deep inside a session.

The generated data set (``generate.py``) and the download (``download.py``) write this
same format, so one reader serves all three.
"""

import os
import tempfile
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import numpy as np

IMAGE_SIZE = 32
IMAGE_CHANNELS = 3
NUM_CLASSES = 10
LABEL_BYTES = 1
IMAGE_BYTES = IMAGE_SIZE * IMAGE_SIZE * IMAGE_CHANNELS  # 3072
RECORD_BYTES = LABEL_BYTES + IMAGE_BYTES  # 3073

BATCHES_DIR = "cifar-10-batches-bin"
TRAIN_FILES = tuple("data_batch_%d.bin" % i for i in range(1, 6))
TEST_FILES = ("test_batch.bin",)
SPLIT_FILES = {"train": TRAIN_FILES, "test": TEST_FILES}

# Every file of the official release holds 10000 records.
OFFICIAL_RECORDS_PER_FILE = 10000
OFFICIAL_FILE_BYTES = OFFICIAL_RECORDS_PER_FILE * RECORD_BYTES  # 30730000

# A file written by generate.py next to the .bin files, so that every script reading the
# folder (train, eval, main) can say in its log that the data is not the real CIFAR-10.
GENERATED_MARKER = "GENERATED_DATA.txt"

CLASS_NAMES = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)

_FIX_HINT = (
    "Fix: pass --download to fetch the official archive into --data_dir, point "
    "--data_dir at the folder that holds %s/, or leave --data_dir unset to train "
    "on the built-in generated data." % BATCHES_DIR
)


class DataError(ValueError):
    """The data on disk is missing or not in the CIFAR-10 binary format."""


@dataclass(frozen=True)
class SplitFiles:
    """The validated files of one split.

    Attributes:
      split: 'train' or 'test'.
      batches_dir: the ``cifar-10-batches-bin`` folder that holds the files.
      paths: the files, in the release's order.
      num_examples: records over all files (an epoch, for 'train').
      generated: True when the folder was written by generate.py (not real CIFAR-10).
    """

    split: str
    batches_dir: str
    paths: Tuple[str, ...]
    num_examples: int
    generated: bool


def find_batches_dir(data_dir: str) -> str:
    """Returns the folder holding the .bin files for ``data_dir``.

    ``data_dir`` may be the folder that contains ``cifar-10-batches-bin/`` (what the archive
    extracts to, and what --download fills) or that folder itself.

    Raises:
      DataError: ``data_dir`` does not exist or is not a directory.
    """
    if not data_dir:
        raise DataError("No CIFAR-10 data directory given. " + _FIX_HINT)
    if not os.path.exists(data_dir):
        raise DataError(
            "CIFAR-10 data directory %r does not exist. %s" % (data_dir, _FIX_HINT)
        )
    if not os.path.isdir(data_dir):
        raise DataError(
            "CIFAR-10 data directory %r is not a directory. %s" % (data_dir, _FIX_HINT)
        )
    nested = os.path.join(data_dir, BATCHES_DIR)
    if os.path.isdir(nested):
        return nested
    if os.path.exists(nested):
        raise DataError("CIFAR-10 data folder %r is a file, not a folder. Fix: move it "
                        "away, then pass --download or put the release's %s/ folder there."
                        % (nested, BATCHES_DIR))
    return data_dir


def check_record_file(path: str, expected_bytes: Optional[int] = None) -> int:
    """Checks one CIFAR-10 .bin file; returns its number of records.

    Checks, in order: the file exists; its size is a positive multiple of RECORD_BYTES
    (or exactly ``expected_bytes`` when given); every label
    byte is in 0..9. The labels are read in one strided pass over a memory map (a fraction
    of a second for a 30 MB file).

    Raises:
      DataError: naming the file, what is wrong with it and how to fix it.
    """
    if os.path.isdir(path):
        raise DataError("CIFAR-10 data file %r is a folder, not a file. Fix: move it "
                        "away and put the release's file of that name there (or pass "
                        "--download)." % path)
    if not os.path.isfile(path):
        raise DataError("CIFAR-10 data file %r is missing. %s" % (path, _FIX_HINT))
    size = os.path.getsize(path)
    records, leftover = divmod(size, RECORD_BYTES)
    if not records or leftover:
        raise DataError(
            "CIFAR-10 data file %r has %d bytes, which is not a positive multiple of the "
            "record size %d (1 label byte + %d image bytes): %d whole records and %d bytes "
            "left over. The file is truncated (an interrupted download or copy) or is not a "
            "CIFAR-10 binary file (CIFAR-100 records have 2 label bytes). Fix: delete it and "
            "download again with --download, or regenerate the generated data set."
            % (path, size, RECORD_BYTES, IMAGE_BYTES, records, leftover)
        )
    if expected_bytes is not None and size != expected_bytes:
        raise DataError(
            "CIFAR-10 data file %r has %d bytes but the official release has %d bytes "
            "(%d records) per file. Fix: delete it and download again with --download."
            % (path, size, expected_bytes, expected_bytes // RECORD_BYTES)
        )
    records = np.memmap(path, dtype=np.uint8, mode="r").reshape(-1, RECORD_BYTES)
    labels = np.asarray(records[:, 0])
    # Every label 0 is rare in real data; then the images say whether the file is blank
    # (zero-filled: a preallocated or failed copy), read only in that case.
    blank = labels.size > 1 and not labels.any() and not records.any()
    del records
    if blank:
        raise DataError(
            "CIFAR-10 data file %r holds only zero bytes (%d blank records): a zero-filled "
            "file, not data. Fix: delete it and download again with --download, or "
            "regenerate the generated data set." % (path, labels.size))
    bad = np.flatnonzero(labels >= NUM_CLASSES)
    if bad.size:
        raise DataError(
            "CIFAR-10 data file %r: record %d has label %d, outside 0..%d (%d of %d records "
            "are out of range). The file is not a CIFAR-10 binary file (a CIFAR-100 file, or "
            "another data set). Fix: point --data_dir at the CIFAR-10 binary release, "
            "download it with --download, or regenerate the generated data set."
            % (path, bad[0], labels[bad[0]], NUM_CLASSES - 1, bad.size, labels.size)
        )
    return labels.size


def validate_split(data_dir: str, split: str) -> SplitFiles:
    """Validates all files of ``split`` ('train' or 'test') under ``data_dir``.

    Call this before building a graph: every problem surfaces here as a DataError.
    """
    if split not in SPLIT_FILES:
        raise ValueError(
            "Unknown split %r; expected one of %s." % (split, sorted(SPLIT_FILES))
        )
    batches_dir = find_batches_dir(data_dir)
    paths = tuple(os.path.join(batches_dir, name) for name in SPLIT_FILES[split])
    for path in paths:
        if os.path.isdir(path):  # not "missing": say what is there
            check_record_file(path)
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        raise DataError(
            "CIFAR-10 data file %r is missing%s (the %s split needs %s in %r). %s"
            % (
                missing[0],
                " (and %d more)" % (len(missing) - 1) if len(missing) > 1 else "",
                split,
                ", ".join(SPLIT_FILES[split]),
                batches_dir,
                _FIX_HINT,
            )
        )
    num_examples = sum(check_record_file(p) for p in paths)
    return SplitFiles(
        split=split,
        batches_dir=batches_dir,
        paths=paths,
        num_examples=num_examples,
        generated=os.path.isfile(os.path.join(batches_dir, GENERATED_MARKER)),
    )


def encode_records(images: np.ndarray, labels: np.ndarray) -> bytes:
    """Encodes images uint8 [N, 32, 32, 3] (height, width, channel) and labels [N] as records.

    The inverse of what the reader decodes: the image is stored depth-major [3, 32, 32].
    """
    images = np.asarray(images)
    labels = np.asarray(labels)
    if images.dtype != np.uint8 or images.shape[1:] != (
        IMAGE_SIZE,
        IMAGE_SIZE,
        IMAGE_CHANNELS,
    ):
        raise ValueError(
            "images must be uint8 [N, 32, 32, 3], got %s %s" % (images.dtype, images.shape)
        )
    if labels.shape != images.shape[:1]:
        raise ValueError(
            "labels must have shape [%d], got %s" % (images.shape[0], labels.shape)
        )
    if labels.size and (labels.min() < 0 or labels.max() >= NUM_CLASSES):
        raise ValueError("labels must be in 0..%d" % (NUM_CLASSES - 1))
    records = np.empty((images.shape[0], RECORD_BYTES), dtype=np.uint8)
    records[:, 0] = labels
    records[:, LABEL_BYTES:] = images.transpose(0, 3, 1, 2).reshape(images.shape[0], -1)
    return records.tobytes()


def write_records(path: str, images: np.ndarray, labels: np.ndarray) -> None:
    """Writes one .bin file atomically: a temporary file in the same folder, then a rename."""
    payload = encode_records(images, labels)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp_path = tempfile.mkstemp(dir=folder, prefix="." + os.path.basename(path) + ".")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
        os.replace(tmp_path, path)
    except BaseException:
        if os.path.exists(tmp_path):
            os.remove(tmp_path)
        raise


def read_records_numpy(path: str) -> Tuple[np.ndarray, np.ndarray]:
    """Reads one .bin file into (images uint8 [N, 32, 32, 3], labels uint8 [N]); for tests
    and small tools (the training input uses the tf.data reader below)."""
    check_record_file(path)
    records = np.fromfile(path, dtype=np.uint8).reshape(-1, RECORD_BYTES)
    images = records[:, LABEL_BYTES:].reshape(-1, IMAGE_CHANNELS, IMAGE_SIZE, IMAGE_SIZE)
    return images.transpose(0, 2, 3, 1).copy(), records[:, 0].copy()


def decode_record(record):
    """Decodes one record (a string tensor of RECORD_BYTES bytes).

    Returns:
      image: uint8 [32, 32, 3], height-width-channel (the file stores [3, 32, 32]).
      label: int32 scalar.
    """
    import tensorflow as tf

    raw = tf.io.decode_raw(record, tf.uint8)
    label = tf.cast(raw[0], tf.int32)
    depth_major = tf.reshape(
        raw[LABEL_BYTES:RECORD_BYTES], [IMAGE_CHANNELS, IMAGE_SIZE, IMAGE_SIZE]
    )
    image = tf.transpose(depth_major, [1, 2, 0])
    return image, label


def records_dataset(paths: Sequence[str]):
    """A tf.data.Dataset of (image uint8 [32, 32, 3], label int32 []) read from ``paths``
    in file order. The files should have been validated (validate_split)."""
    import tensorflow as tf

    dataset = tf.data.FixedLengthRecordDataset(list(paths), record_bytes=RECORD_BYTES)
    return dataset.map(
        decode_record, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
    )

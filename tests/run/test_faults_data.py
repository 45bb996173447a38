"""Bad data: a clear error naming the file or the values, never a silent result."""

import numpy as np
import pytest
import tensorflow as tf

import towerlib

RECORD = 5   # bytes per record in these tests
HEADER = 3


def _write(path, size):
    path.write_bytes(bytes(range(256)) * (size // 256) + bytes(size % 256))
    return str(path)


def test_every_bad_file_is_named_with_its_size_and_the_fix(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    good = _write(data / "good.bin", HEADER + 4 * RECORD)
    truncated = _write(data / "truncated.bin", HEADER + 2 * RECORD + 3)
    empty = _write(data / "empty.bin", 0)
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(towerlib.DataError) as raised:
        towerlib.check_record_files(
            [str(data), str(tmp_path / "missing.bin"), str(tmp_path / "empty_dir"),
             str(tmp_path / "nothing-*.bin")], RECORD, header_bytes=HEADER)
    message = str(raised.value)
    assert message.startswith("5 bad input files:")
    assert (f"{truncated}: 16 bytes is not 3 header + a whole number of 5-byte records "
            "+ 0 footer (2 records and 3 bytes left over): the file is truncated") in message
    assert f"{empty}: the file is empty (0 bytes)" in message
    assert f"{tmp_path / 'missing.bin'}: the file does not exist" in message
    assert f"{tmp_path / 'empty_dir'}: the directory is empty" in message
    assert f"{tmp_path / 'nothing-*.bin'}: no file matches this pattern" in message
    assert good not in message
    assert message.count("Fix:") == 5


def test_good_files_report_their_record_counts(tmp_path):
    first = _write(tmp_path / "a.bin", HEADER + 4 * RECORD)
    second = _write(tmp_path / "b.bin", HEADER + 1 * RECORD)
    found = towerlib.check_record_files(str(tmp_path / "*.bin"), RECORD,
                                        header_bytes=HEADER)
    assert (found.paths, found.records, found.total_records) == ([first, second], [4, 1], 5)


def test_why_files_are_checked_tf_data_reads_an_empty_file_as_no_records(tmp_path):
    empty = _write(tmp_path / "empty.bin", 0)
    header_only = _write(tmp_path / "header_only.bin", HEADER)
    # No error from tf.data, just no records:
    assert list(tf.data.FixedLengthRecordDataset(empty, RECORD)) == []
    assert list(tf.data.FixedLengthRecordDataset(header_only, RECORD,
                                                 header_bytes=HEADER)) == []
    with pytest.raises(towerlib.DataError, match="the file is empty"):
        towerlib.check_record_files(empty, RECORD)
    with pytest.raises(towerlib.DataError, match="holds 0 records, fewer than 1"):
        towerlib.check_record_files(header_only, RECORD, header_bytes=HEADER)


def _run(tensor, feed):
    with tf.compat.v1.Session() as session:
        return session.run(tensor, feed)


def test_labels_out_of_range_stop_the_step_naming_the_range_and_values():
    with tf.Graph().as_default():
        labels = tf.compat.v1.placeholder(tf.int32, [None])
        checked = towerlib.assert_labels_in_range(labels, 10, name="cifar_labels")
        np.testing.assert_array_equal(_run(checked, {labels: [0, 9, 3]}), [0, 9, 3])
        assert _run(checked, {labels: []}).size == 0
        for bad, low, high in (([1, 12, 3], 1, 12), ([-1, 0], -1, 0)):
            with pytest.raises(tf.errors.InvalidArgumentError) as raised:
                _run(checked, {labels: bad})
            assert ("cifar_labels must be in [0, 10); the data is corrupt or num_classes "
                    "is wrong") in raised.value.message
            assert f"[{low}] [{high}]" in raised.value.message


def test_non_finite_inputs_stop_the_step_naming_the_tensor():
    with tf.Graph().as_default():
        images = tf.compat.v1.placeholder(tf.float32, [None, 2])
        checked = towerlib.assert_finite(images, "images")
        _run(checked, {images: [[0.0, 1.0]]})
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match="images holds NaN or Inf: the input data is corrupt"):
            _run(checked, {images: [[0.0, np.inf]]})

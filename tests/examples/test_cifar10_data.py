"""Tests of the CIFAR-10 example's data side: format, validation, generator, pipelines."""

import hashlib
import os

import numpy as np
import pytest
import tensorflow as tf

from examples.cifar10 import data, generate, input_pipeline


def _random_examples(num, seed=0):
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(num, 32, 32, 3), dtype=np.uint8)
    labels = rng.integers(0, 10, size=num).astype(np.uint8)
    return images, labels


def _write_split_files(batches_dir, records_per_file=3):
    os.makedirs(batches_dir, exist_ok=True)
    for index, name in enumerate(data.TRAIN_FILES + data.TEST_FILES):
        data.write_records(
            os.path.join(batches_dir, name), *_random_examples(records_per_file, seed=index)
        )


def _sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


# --- the record format -------------------------------------------------------------------


def test_decode_reads_label_byte_then_depth_major_image(tmp_path):
    # Built byte by byte from the published layout, independently of encode_records.
    record = np.zeros(data.RECORD_BYTES, dtype=np.uint8)
    record[0] = 7
    planes = record[1:].reshape(3, 32, 32)
    planes[0] = 10  # red plane
    planes[1] = 20  # green plane
    planes[2] = 30  # blue plane
    planes[2, 5, 9] = 255  # one blue pixel at row 5, column 9
    path = tmp_path / "one.bin"
    path.write_bytes(record.tobytes())

    image, label = next(iter(data.records_dataset([str(path)])))
    image = image.numpy()
    assert label.numpy() == 7 and label.dtype == tf.int32
    assert image.shape == (32, 32, 3) and image.dtype == np.uint8
    np.testing.assert_array_equal(image[0, 0], [10, 20, 30])
    np.testing.assert_array_equal(image[5, 9], [10, 20, 255])
    assert (image[:, :, 2] == 255).sum() == 1


def test_write_then_read_round_trips_through_tf_data_and_numpy(tmp_path):
    images, labels = _random_examples(5)
    path = str(tmp_path / "data_batch_1.bin")
    data.write_records(path, images, labels)
    assert os.path.getsize(path) == 5 * 3073

    decoded = list(data.records_dataset([path]))
    np.testing.assert_array_equal(np.stack([i.numpy() for i, _ in decoded]), images)
    np.testing.assert_array_equal([l.numpy() for _, l in decoded], labels)
    np_images, np_labels = data.read_records_numpy(path)
    np.testing.assert_array_equal(np_images, images)
    np.testing.assert_array_equal(np_labels, labels)
    assert [p.name for p in tmp_path.iterdir()] == ["data_batch_1.bin"]  # no temp file left


def test_encode_rejects_wrong_shapes_and_labels():
    images, labels = _random_examples(2)
    with pytest.raises(ValueError, match="uint8"):
        data.encode_records(images.astype(np.float32), labels)
    with pytest.raises(ValueError, match="0..9"):
        data.encode_records(images, np.array([1, 10]))


# --- validation before any graph is built --------------------------------------------------


def test_validate_counts_examples_and_accepts_either_folder(tmp_path):
    _write_split_files(str(tmp_path / data.BATCHES_DIR), records_per_file=3)
    for folder in (tmp_path, tmp_path / data.BATCHES_DIR):
        train = data.validate_split(str(folder), "train")
        test = data.validate_split(str(folder), "test")
        assert train.num_examples == 15 and test.num_examples == 3
        assert [os.path.basename(p) for p in train.paths] == list(data.TRAIN_FILES)
        assert not train.generated


def test_missing_data_dir_error_names_folder_and_fixes(tmp_path):
    missing = str(tmp_path / "nowhere")
    with pytest.raises(data.DataError) as e:
        data.validate_split(missing, "train")
    assert "does not exist" in str(e.value) and missing in str(e.value)
    assert "--download" in str(e.value)


def test_data_dir_that_is_a_file_is_reported(tmp_path):
    path = tmp_path / "file"
    path.write_text("x")
    with pytest.raises(data.DataError, match="not a directory"):
        data.validate_split(str(path), "test")


def test_missing_file_error_names_the_file(tmp_path):
    batches = tmp_path / data.BATCHES_DIR
    _write_split_files(str(batches))
    os.remove(batches / "data_batch_3.bin")
    with pytest.raises(data.DataError) as e:
        data.validate_split(str(tmp_path), "train")
    assert "data_batch_3.bin" in str(e.value) and "missing" in str(e.value)
    assert data.validate_split(str(tmp_path), "test").num_examples == 3  # test split intact


def test_a_folder_where_a_file_belongs_is_named_not_missing(tmp_path):
    """Both were reported as "missing"."""
    batches = tmp_path / data.BATCHES_DIR
    _write_split_files(str(batches))
    os.remove(batches / "data_batch_3.bin")
    os.mkdir(batches / "data_batch_3.bin")
    with pytest.raises(data.DataError, match=r"data_batch_3.bin' is a folder, not a file"):
        data.validate_split(str(tmp_path), "train")
    other = tmp_path / "other"
    other.mkdir()
    (other / data.BATCHES_DIR).write_text("x")
    with pytest.raises(data.DataError, match=r"cifar-10-batches-bin' is a file, not a folder"):
        data.validate_split(str(other), "test")


def test_a_zero_filled_file_is_refused(tmp_path):
    """A file of zero bytes only was accepted as blank images of
    class 0; one real record of class 0 is still fine."""
    batches = tmp_path / data.BATCHES_DIR
    _write_split_files(str(batches))
    (batches / "test_batch.bin").write_bytes(bytes(3 * data.RECORD_BYTES))
    with pytest.raises(data.DataError, match=r"holds only zero bytes \(3 blank records\)"):
        data.validate_split(str(tmp_path), "test")
    one_black_image = bytes(data.RECORD_BYTES - 1) + b"\x01"
    (batches / "test_batch.bin").write_bytes(bytes(data.RECORD_BYTES) + one_black_image)
    assert data.validate_split(str(tmp_path), "test").num_examples == 2


def test_truncated_file_error_names_file_size_and_fix(tmp_path):
    batches = tmp_path / data.BATCHES_DIR
    _write_split_files(str(batches))
    path = batches / "data_batch_2.bin"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(data.DataError) as e:
        data.validate_split(str(tmp_path), "train")
    message = str(e.value)
    assert "data_batch_2.bin" in message and str(3 * 3073 - 100) in message
    assert "truncated" in message and "--download" in message


def test_empty_file_is_rejected(tmp_path):
    batches = tmp_path / data.BATCHES_DIR
    _write_split_files(str(batches))
    (batches / "test_batch.bin").write_bytes(b"")
    with pytest.raises(data.DataError, match="test_batch.bin.*0 bytes"):
        data.validate_split(str(tmp_path), "test")


def test_exact_size_check_for_the_official_release(tmp_path):
    path = str(tmp_path / "test_batch.bin")
    data.write_records(path, *_random_examples(2))
    with pytest.raises(data.DataError, match="30730000"):
        data.check_record_file(path, expected_bytes=data.OFFICIAL_FILE_BYTES)


def test_label_out_of_range_names_file_record_and_label(tmp_path):
    batches = tmp_path / data.BATCHES_DIR
    _write_split_files(str(batches))
    path = batches / "test_batch.bin"
    raw = bytearray(path.read_bytes())
    raw[2 * 3073] = 57  # the label byte of record 2
    path.write_bytes(bytes(raw))
    with pytest.raises(data.DataError) as e:
        data.validate_split(str(tmp_path), "test")
    message = str(e.value)
    assert "test_batch.bin" in message and "record 2" in message and "label 57" in message


# --- the generated data set ---------------------------------------------------------------


def test_generator_is_deterministic_balanced_and_marked(tmp_path):
    kwargs = dict(seed=3, train_per_file=20, test_examples=30)
    first = generate.generate(str(tmp_path / "a"), **kwargs)
    second = generate.generate(str(tmp_path / "b"), **kwargs)
    other_seed = generate.generate(str(tmp_path / "c"), **dict(kwargs, seed=4))
    names = data.TRAIN_FILES + data.TEST_FILES
    assert [_sha256(os.path.join(first, n)) for n in names] == [
        _sha256(os.path.join(second, n)) for n in names
    ]
    assert _sha256(os.path.join(first, "test_batch.bin")) != _sha256(
        os.path.join(other_seed, "test_batch.bin")
    )
    # Files are independent samples, not copies of each other.
    assert len({_sha256(os.path.join(first, n)) for n in names}) == len(names)

    split = data.validate_split(str(tmp_path / "a"), "train")
    assert split.generated and split.num_examples == 100
    _, labels = data.read_records_numpy(os.path.join(first, "test_batch.bin"))
    np.testing.assert_array_equal(np.bincount(labels, minlength=10), [3] * 10)
    # Only the finished folder is left: no staging folder.
    assert os.listdir(str(tmp_path / "a")) == [data.BATCHES_DIR]
    assert "NOT the CIFAR-10" in open(os.path.join(first, data.GENERATED_MARKER)).read()


def test_generated_classes_are_not_told_apart_by_mean_colour():
    # No per-image constant may give the class away: a nearest-class-mean classifier on the
    # mean colour of each image is no better than chance on fresh examples, so a model has
    # to look at the shapes.
    train_images, train_labels = generate.make_examples(2000, np.random.default_rng(0))
    test_images, test_labels = generate.make_examples(2000, np.random.default_rng(1))
    mean_colour = lambda images: images.reshape(len(images), -1, 3).mean(axis=1)
    train_means, test_means = mean_colour(train_images), mean_colour(test_images)
    centroids = np.stack([train_means[train_labels == c].mean(axis=0) for c in range(10)])
    distances = ((test_means[:, None, :] - centroids[None]) ** 2).sum(axis=-1)
    assert (distances.argmin(axis=1) == test_labels).mean() < 0.15  # chance is 0.10
    # ...but the shapes differ: the mean absolute difference between vertically adjacent
    # pixels separates horizontal stripes (class 0) from vertical stripes (class 1).
    vertical_change = np.abs(np.diff(train_images.astype(float), axis=1)).mean(
        axis=(1, 2, 3)
    )
    assert (
        vertical_change[train_labels == 0].min() > vertical_change[train_labels == 1].max()
    )


def test_interrupted_generation_leaves_nothing(tmp_path, monkeypatch):
    calls = []
    real_write = data.write_records

    def failing_write(path, images, labels):
        calls.append(path)
        if len(calls) == 3:
            raise OSError("disk full (simulated)")
        real_write(path, images, labels)

    monkeypatch.setattr(data, "write_records", failing_write)
    with pytest.raises(OSError, match="simulated"):
        generate.generate(str(tmp_path), train_per_file=5, test_examples=5)
    assert os.listdir(str(tmp_path)) == []


def test_ensure_generated_reuses_its_own_folder_and_refuses_others(tmp_path):
    path = generate.ensure_generated(str(tmp_path / "g"), train_per_file=5, test_examples=5)
    stamp = os.path.getmtime(os.path.join(path, "test_batch.bin"))
    assert generate.ensure_generated(str(tmp_path / "g")) == path
    assert os.path.getmtime(os.path.join(path, "test_batch.bin")) == stamp

    _write_split_files(str(tmp_path / "real" / data.BATCHES_DIR))
    with pytest.raises(data.DataError, match="not written by the generator"):
        generate.ensure_generated(str(tmp_path / "real"))


# --- input pipelines ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_generated(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("gen"))
    generate.generate(folder, train_per_file=8, test_examples=10)
    return data.validate_split(folder, "train"), data.validate_split(folder, "test")


@pytest.mark.parametrize("augmentation", ["tutorial", "resnet"])
def test_train_batches_have_global_batch_shape_and_are_standardized(
    small_generated, augmentation
):
    train, _ = small_generated
    dataset = input_pipeline.train_dataset(train, 12, augmentation, seed=1)
    assert dataset.element_spec[0].shape.as_list() == [12, 32, 32, 3]
    assert dataset.element_spec[1].shape.as_list() == [12]
    batches = list(dataset.take(5))  # 60 examples from 40: the stream repeats
    images, labels = batches[0]
    assert images.dtype == tf.float32 and labels.dtype == tf.int32
    per_image = images.numpy().reshape(12, -1)
    np.testing.assert_allclose(per_image.mean(axis=1), 0, atol=1e-4)
    np.testing.assert_allclose(per_image.std(axis=1), 1, atol=1e-2)
    assert set(np.concatenate([l.numpy() for _, l in batches])) <= set(range(10))


def test_pad_crop_flip_returns_a_shifted_window_of_the_image():
    image = np.random.default_rng(0).integers(1, 256, size=(32, 32, 3)).astype(np.uint8)
    padded = np.pad(image.astype(np.float32), [(4, 4), (4, 4), (0, 0)])
    windows = {}
    for dy in range(9):
        for dx in range(9):
            window = padded[dy : dy + 32, dx : dx + 32]
            windows[(dy, dx, False)] = window
            windows[(dy, dx, True)] = window[:, ::-1]
    seen = set()
    for _ in range(40):
        out = input_pipeline._random_pad_crop_flip(tf.constant(image)).numpy()
        matches = [key for key, w in windows.items() if np.array_equal(out, w)]
        assert matches, "output is not a (flipped) 32x32 window of the padded image"
        seen.add(matches[0])
    assert len(seen) > 10  # it is random: offsets and flips vary
    assert any(flipped for _, _, flipped in seen) and any(not f for _, _, f in seen)


def test_eval_pipeline_is_deterministic_and_covers_every_example_once(small_generated):
    _, test = small_generated
    first = list(input_pipeline.eval_dataset(test, 4))
    second = list(input_pipeline.eval_dataset(test, 4))
    assert [len(l) for _, l in first] == [4, 4, 2]  # the last batch is partial
    for (a, la), (b, lb) in zip(first, second, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
        np.testing.assert_array_equal(la.numpy(), lb.numpy())
    images, labels = data.read_records_numpy(test.paths[0])
    np.testing.assert_array_equal(np.concatenate([l.numpy() for _, l in first]), labels)
    expected = tf.image.per_image_standardization(images[3].astype(np.float32)).numpy()
    np.testing.assert_allclose(first[0][0].numpy()[3], expected, rtol=1e-5, atol=1e-5)


def test_unknown_augmentation_and_bad_batch_are_rejected(small_generated):
    train, _ = small_generated
    with pytest.raises(ValueError, match="Unknown augmentation 'fancy'.*tutorial, resnet"):
        input_pipeline.train_dataset(train, 8, "fancy")
    with pytest.raises(ValueError, match="global_batch_size"):
        input_pipeline.train_dataset(train, 0)

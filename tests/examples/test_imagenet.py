"""The ImageNet-style example: its records, its crops, its network and its runs."""

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import towerlib
from examples.imagenet import records, resnet, train

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    folder = tmp_path_factory.mktemp("shards")
    return records.write_shards(str(folder), 20, num_shards=3, image_size=48, seed=1)


def test_generated_shards_have_the_layout_tf_cnn_benchmarks_reads(shards):
    assert [os.path.basename(p) for p in shards] == [
        "train-00000-of-00003", "train-00001-of-00003", "train-00002-of-00003"]
    # Read back without towerlib or this example: TensorFlow's own reader and parser.
    spec = {"image/encoded": tf.io.FixedLenFeature([], tf.string),
            "image/class/label": tf.io.FixedLenFeature([], tf.int64)}
    counts, labels = [], []
    for path in shards:
        parsed = [tf.io.parse_single_example(r, spec) for r in tf.data.TFRecordDataset(path)]
        counts.append(len(parsed))
        for example in parsed:
            assert tf.io.decode_jpeg(example["image/encoded"]).shape == (48, 48, 3)
            labels.append(int(example["image/class/label"]))
    assert counts == [7, 7, 6]
    assert min(labels) >= 1 and max(labels) <= 1000 and len(set(labels)) > 10, labels


def _augmented(shards, seed, size=32):
    record = next(iter(tf.data.TFRecordDataset(shards[0])))
    return records.train_augment(size)(records.parse(record),
                                       tf.constant(seed, tf.int64))


def test_the_crop_and_flip_are_functions_of_the_example_seed(shards):
    image, label = _augmented(shards, [3, 4])
    again, _ = _augmented(shards, [3, 4])
    assert image.shape == (32, 32, 3) and image.dtype == tf.float32
    assert label.dtype == tf.int32 and 1 <= int(label) <= 1000
    np.testing.assert_array_equal(image.numpy(), again.numpy())
    others = [_augmented(shards, [3, k])[0].numpy() for k in range(5, 13)]
    assert all(not np.array_equal(image.numpy(), other) for other in others)
    # Standardized with ImageNet's statistics: about zero mean, unit spread.
    assert abs(float(tf.reduce_mean(image))) < 2 and 0.1 < float(tf.math.reduce_std(image)) < 3


def _global_batches(shards, num_workers, steps=2, batch=6):
    """Each step's whole global batch as the workers read it, concatenated in order."""
    with tf.Graph().as_default():
        source = towerlib.TFRecords(shards, decode=records.parse)
        slices = [towerlib.global_batch_input(
            source, batch, seed=7, augment=records.train_augment(24),
            workers=towerlib.WorkerGroup(num_workers, r), name=f"input{r}")
            for r in range(num_workers)]
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(tf.compat.v1.tables_initializer())   # the inputs' iterators
            out = []
            for _ in range(steps):
                parts = session.run(slices)
                out.append([np.concatenate([p[k] for p in parts]) for k in range(2)])
            return out


def test_one_worker_reads_what_two_or_three_workers_read_between_them(shards):
    whole = _global_batches(shards, 1)
    for workers in (2, 3):
        for (images, labels), (expected_images, expected_labels) in zip(
                _global_batches(shards, workers), whole):
            np.testing.assert_array_equal(labels, expected_labels)
            np.testing.assert_array_equal(images, expected_images)


def test_resnet50_has_as_many_weights_as_tf_keras_resnet50():
    tf_keras = pytest.importorskip("tf_keras")
    with tf.Graph().as_default():
        inputs = (tf.zeros([1, 224, 224, 3]), tf.zeros([1], tf.int32))
        towerlib.build_train_graph(resnet.ResNet("resnet50"), inputs,
                                   tf.compat.v1.train.GradientDescentOptimizer(0.1))
        ours = sum(v.shape.num_elements() for v in tf.compat.v1.trainable_variables())
    # The reference: tf_keras' ResNet50 (v1; the stride's place does not change the
    # weights), whose convolutions carry biases that ours leave to batch norm.
    with tf.Graph().as_default():
        keras = tf_keras.applications.ResNet50(weights=None, classes=records.NUM_CLASSES)
        conv_biases = sum(layer.filters for layer in keras.layers
                          if isinstance(layer, tf_keras.layers.Conv2D))
        reference = sum(int(np.prod(w.shape)) for w in keras.trainable_weights) - conv_biases
    # 25,557,032 at 1000 classes, as tf_cnn_benchmarks counts it; one class more adds
    # 2,048 weights and a bias.
    assert ours == reference == 25_557_032 + 2049, (ours, reference)


def test_generated_shards_are_reused_and_a_folder_of_other_files_is_refused(tmp_path):
    folder = str(tmp_path / "generated")
    train.generated_shards(folder, 8, 32)
    first = os.stat(os.path.join(folder, "train-00000-of-00008")).st_mtime_ns
    train.generated_shards(folder, 8, 32)
    assert os.stat(os.path.join(folder, "train-00000-of-00008")).st_mtime_ns == first
    foreign = tmp_path / "theirs"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="holds files this script did not write"):
        train.generated_shards(str(foreign), 8, 32)
    assert (foreign / "notes.txt").read_text() == "mine"


def _run(args, timeout=600):
    command = [sys.executable, "-m"] + args
    # No TF_CPP_MIN_LOG_LEVEL, as in a user's shell: the example quiets TensorFlow's
    # start-up lines itself (a level the user set turns that off).
    environ = {k: v for k, v in os.environ.items()
               if k not in ("TF_CONFIG", "TF_CPP_MIN_LOG_LEVEL")}
    environ["PYTHONPATH"] = REPO
    return subprocess.run(command, cwd=REPO, env=environ, capture_output=True, text=True,
                          timeout=timeout)


def _flags(tmp_path, run, steps, towers):
    return ["examples.imagenet.train", "--model=resnet_mini", "--image_size=32",
            "--generated_records=48", f"--generated_dir={tmp_path / 'data'}",
            f"--train_dir={tmp_path / run}", f"--max_steps={steps}", "--bn_mode=sync",
            f"--num_towers={towers}", "--global_batch_size=12", "--save_checkpoint_steps=2"]


@pytest.mark.slow  # four fresh processes training, two of them under the launcher
def test_a_run_resumed_on_another_topology_ends_where_an_uninterrupted_one_does(tmp_path):
    whole = _run(_flags(tmp_path, "whole", 6, 2))
    assert whole.returncode == 0, whole.stderr
    assert "finished: global_step=6" in whole.stdout
    # The same run cut twice: 1 worker x 2 towers to step 2, 2 workers x 1 tower to step
    # 4 (towerlib's launcher, all-reduce across the workers), 1 worker x 3 towers to 6.
    for steps, towers, launcher in ((2, 2, []), (4, 1, ["towerlib.launch", "--workers",
                                                        "2", "--", sys.executable, "-m"]),
                                    (6, 3, [])):
        part = _run(launcher + _flags(tmp_path, "cut", steps, towers))
        assert part.returncode == 0, part.stderr[-3000:]
    reader = tf.train.load_checkpoint(str(tmp_path / "whole" / "model.ckpt-6"))
    other = tf.train.load_checkpoint(str(tmp_path / "cut" / "model.ckpt-6"))
    names = [n for n, d in reader.get_variable_to_dtype_map().items() if d != tf.variant]
    assert len(names) > 50 and "global_step" in names
    for name in names:
        # float32 sums over 1, 2 or 3 towers in another order: each step's rounding
        # (2^-24 of the values) grows through 6 steps of a 14-layer network; 1e-5 is
        # the bound towerlib's other resized runs are held to.
        np.testing.assert_allclose(other.get_tensor(name), reader.get_tensor(name),
                                   rtol=1e-5, atol=1e-5, err_msg=name)


@pytest.mark.slow  # a fresh process
def test_a_folder_without_shards_is_one_line_and_exit_2(tmp_path):
    completed = _run(["examples.imagenet.train", f"--data_dir={tmp_path}",
                      f"--train_dir={tmp_path / 'run'}"], timeout=300)
    assert completed.returncode == 2, completed.stderr
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1 and f"--data_dir={tmp_path} has no train-* shards" in lines[0], \
        completed.stderr
    assert not (tmp_path / "run").exists()


def test_workers_generating_together_end_with_one_whole_folder(tmp_path, monkeypatch):
    # Worker 1 renames its folder into place while worker 0 is still writing its own:
    # worker 0's rename fails, and it uses worker 1's shards; nothing half-written stays.
    folder = str(tmp_path / "generated")
    write = records.write_shards

    def other_worker_first(partial, *args, **kwargs):
        monkeypatch.setattr(records, "write_shards", write)
        train.generated_shards(folder, 8, 32)   # the other worker, done first
        write(partial, *args, **kwargs)
    monkeypatch.setattr(records, "write_shards", other_worker_first)
    assert train.generated_shards(folder, 8, 32) == folder
    assert sorted(os.listdir(tmp_path)) == ["generated"]   # no '.partial-' folder left
    names = sorted(os.listdir(folder))
    assert names == ["generated.json"] + [f"train-{k:05d}-of-00008" for k in range(8)]
    assert train._generated_request(folder) == {"records": 8, "image_size": 32}

"""towerlib.global_batch_input: the global batch of a step is fixed by the seed and the
position, whatever the workers; its position is saved in checkpoints as a few numbers."""

import os

import numpy as np
import pytest
import tensorflow as tf

import towerlib
from towerlib.run import data_position, global_batches

N = 10
IMAGES = np.arange(N * 2, dtype=np.float32).reshape(N, 2)
LABELS = np.arange(N, dtype=np.int32)


def _labels_read(steps, batch=4, seed=3, workers=None, augment=None, restore=None,
                 save=None, **options):
    """The labels this worker reads at each of `steps` steps (after `restore`)."""
    with tf.Graph().as_default():
        images, labels = towerlib.global_batch_input(
            (IMAGES, LABELS), batch, seed=seed, workers=workers, augment=augment, **options)
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            if restore:
                saver.restore(session, restore)
            session.run(tf.compat.v1.tables_initializer())
            read = [session.run((images, labels)) for _ in range(steps)]
            if save:
                saver.save(session, save)
    return read


def _global_batches(num_workers, steps=6, batch=4, **options):
    """Each step's global batch as the workers' slices put together, in worker order."""
    per_worker = [_labels_read(steps, batch, workers=towerlib.WorkerGroup(num_workers, w),
                               **options) for w in range(num_workers)]
    return [np.concatenate([slices[s][1] for slices in per_worker]).tolist()
            for s in range(steps)]


def test_the_global_batch_is_the_same_for_any_number_of_workers():
    one = _global_batches(1)
    assert _global_batches(2) == one
    assert _global_batches(3) == one  # 4 over 3 workers: slices of 2, 1, 1


def test_each_epoch_is_a_permutation_and_epochs_differ():
    stream = sum(_global_batches(1, steps=5), [])  # 20 positions: two epochs
    first, second = stream[:N], stream[N:]
    assert sorted(first) == list(range(N)) and sorted(second) == list(range(N))
    assert first != second and first != list(range(N))


def test_another_seed_reads_another_order():
    assert _global_batches(1, seed=4) != _global_batches(1, seed=3)


def test_each_worker_reads_only_its_slice():
    slices = [_labels_read(1, 5, workers=towerlib.WorkerGroup(2, w))[0][1]
              for w in range(2)]
    assert [len(s) for s in slices] == [3, 2]


def test_augmentation_randomness_is_keyed_by_example_and_epoch_not_by_worker():
    def augment(example, seed):
        image, label = example
        return image + tf.random.stateless_uniform([2], seed), label

    def noise_by_key(num_workers):
        found = {}
        for w in range(num_workers):
            for images, labels in _labels_read(
                    5, augment=augment, workers=towerlib.WorkerGroup(num_workers, w)):
                for image, label in zip(images, labels):  # 20 positions: two epochs
                    found.setdefault(int(label), []).append(
                        (image - IMAGES[label]).round(6).tolist())
        return {label: sorted(noises) for label, noises in found.items()}

    one, two = noise_by_key(1), noise_by_key(2)
    assert one == two
    # The same example in two epochs gets other randomness.
    assert all(len(v) == 2 and v[0] != v[1] for v in one.values())


def test_a_restored_run_reads_what_the_uninterrupted_run_reads(tmp_path):
    uninterrupted = [labels.tolist() for _, labels in _labels_read(7)]
    prefix = str(tmp_path / "model.ckpt")
    first = _labels_read(3, save=prefix)
    rest = _labels_read(4, restore=prefix)
    assert [labels.tolist() for _, labels in first + rest] == uninterrupted


def test_resumed_on_another_worker_count_reads_the_same_global_batches(tmp_path):
    uninterrupted = _global_batches(1, steps=7)
    prefix = str(tmp_path / "model.ckpt")
    _labels_read(3, save=prefix)
    assert _global_batches(2, steps=4, restore=prefix) == uninterrupted[3:]


def test_the_saved_state_is_six_numbers(tmp_path):
    prefix = str(tmp_path / "model.ckpt")
    _labels_read(3, save=prefix)
    saved = tf.compat.v1.train.NewCheckpointReader(prefix).get_variable_to_shape_map()
    assert sorted(saved) == sorted(f"global_batches/{key}" for key in (
        "seed", "global_batch_size", "examples_before", "batches_read", "num_examples",
        "source_fingerprint"))
    assert all(shape == [] for shape in saved.values())


def test_another_seed_or_global_batch_is_refused_in_one_line(tmp_path):
    prefix = str(tmp_path / "model.ckpt")
    _labels_read(3, save=prefix)
    for options, said in ((dict(seed=4), "seed=3"), (dict(batch=6), "global batch of 4")):
        with tf.Graph().as_default():
            towerlib.global_batch_input((IMAGES, LABELS), options.get("batch", 4),
                                        seed=options.get("seed", 3))
            with pytest.raises(towerlib.CheckpointError, match=said) as raised:
                global_batches.check_checkpoint(tf.compat.v1.get_default_graph(), prefix)
        assert "\n" not in str(raised.value) and "Fix:" in str(raised.value)


def test_a_new_global_batch_when_allowed_goes_on_from_the_example_position(tmp_path):
    stream = sum(_global_batches(1, steps=6), [])
    prefix = str(tmp_path / "model.ckpt")
    _labels_read(3, save=prefix)  # 12 examples read
    with tf.Graph().as_default():
        towerlib.global_batch_input((IMAGES, LABELS), 6, seed=3,
                                    allow_new_global_batch=True)
        said = global_batches.check_checkpoint(tf.compat.v1.get_default_graph(), prefix)
    assert "example 12" in said and "6/4" in said
    after = _labels_read(2, batch=6, restore=prefix, allow_new_global_batch=True)
    assert sum((labels.tolist() for _, labels in after), []) == stream[12:24]


def test_its_iterator_is_not_named_as_unsaved():
    with tf.Graph().as_default():
        images, _ = towerlib.global_batch_input((IMAGES, LABELS), 4, seed=1)
        assert data_position.unsaved_iterators(tf.reduce_sum(images).op) == []


def test_fixed_length_records_are_read_by_index(tmp_path):
    record_bytes = 3
    for f in range(2):  # two files of 5 records: label byte, two data bytes
        rows = [[5 * f + r, 100 + 5 * f + r, 7] for r in range(5)]
        np.array(rows, np.uint8).tofile(str(tmp_path / f"part_{f}.bin"))

    def decode(record):
        values = tf.io.decode_raw(record, tf.uint8)
        return tf.cast(values[1:], tf.float32), tf.cast(values[0], tf.int32)

    source = towerlib.FixedLengthRecords(str(tmp_path / "part_*.bin"), record_bytes, decode)
    with tf.Graph().as_default():
        images, labels = towerlib.global_batch_input(source, 4, seed=3)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(tf.compat.v1.tables_initializer())
            got = [session.run((images, labels)) for _ in range(3)]
    from_arrays = _global_batches(1, steps=3)
    assert [labels.tolist() for _, labels in got] == from_arrays
    for image, label in zip(got[0][0], got[0][1]):
        assert image.tolist() == [100.0 + label, 7.0]


def test_bad_options_are_refused_with_their_fix():
    with tf.Graph().as_default():
        with pytest.raises(ValueError, match="fewer than the 3 workers"):
            towerlib.global_batch_input((IMAGES, LABELS), 2, seed=1,
                                        workers=towerlib.WorkerGroup(3, 0))
        with pytest.raises(ValueError, match="disagree"):
            towerlib.global_batch_input((IMAGES, LABELS[:5]), 2, seed=1)
        with pytest.raises(ValueError, match="seed"):
            towerlib.global_batch_input((IMAGES, LABELS), 2, seed=None)


def test_run_training_refuses_another_global_batch_before_the_run_folder_changes(tmp_path):
    def run(batch, steps):
        with tf.Graph().as_default():
            images, labels = towerlib.global_batch_input((IMAGES, LABELS), batch, seed=3)

            def model(inputs, ctx):
                x, y = inputs
                w = tf.compat.v1.get_variable("w", [2, 1])
                return tf.reduce_mean(tf.square(tf.matmul(x, w)[:, 0] - tf.cast(y, tf.float32)))

            train = towerlib.build_train_graph(
                model, (images, labels), tf.compat.v1.train.GradientDescentOptimizer(1e-3),
                num_towers=2, device_type="cpu")
            return towerlib.run_training(train, train_dir=str(tmp_path), max_steps=steps,
                                         log_every_n_steps=1000, save_summaries_steps=None)

    assert run(4, 2).global_step == 2
    def written():  # the run's files (not the folder lock's)
        return {name: os.path.getmtime(tmp_path / name) for name in os.listdir(tmp_path)
                if not name.startswith(".")}

    before = written()
    with pytest.raises(towerlib.CheckpointError, match="global batch of 4"):
        run(6, 4)
    assert written() == before
    assert run(4, 3).global_step == 3


def test_train_graph_initialize_starts_the_input_at_the_saved_position(tmp_path):
    """A session of one's own: initialize, then after a Saver.restore the tables
    initializer again, and the steps read on from the checkpoint's position."""
    def build():
        images, labels = towerlib.global_batch_input((IMAGES, LABELS), 4, seed=3)

        def model(inputs, ctx):
            x, _ = inputs
            w = tf.compat.v1.get_variable("w", [2, 1])
            return tf.reduce_mean(tf.matmul(x, w))

        train = towerlib.build_train_graph(
            model, (images, labels), tf.compat.v1.train.GradientDescentOptimizer(1e-3),
            num_towers=2, device_type="cpu")
        return train, labels

    expected = [labels.tolist() for _, labels in _labels_read(5)]
    prefix = str(tmp_path / "model.ckpt")
    read = []
    for restore in (False, True):
        with tf.Graph().as_default():
            train, labels = build()
            saver = tf.compat.v1.train.Saver()
            with tf.compat.v1.Session(config=towerlib.session_config(2)) as session:
                train.initialize(session)
                if restore:
                    saver.restore(session, prefix)
                    session.run(tf.compat.v1.tables_initializer())
                for _ in range(3 if not restore else 2):
                    read.append(session.run([train.train_op, labels])[1].tolist())
                saver.save(session, prefix)
    assert read == expected


def test_a_resumed_run_saves_the_numbers_an_uninterrupted_one_does(tmp_path):
    def saved(prefix):
        reader = tf.compat.v1.train.NewCheckpointReader(prefix)
        return {name: int(reader.get_tensor(name))
                for name in reader.get_variable_to_shape_map()}

    whole, first, second = (str(tmp_path / name) for name in ("whole", "first", "second"))
    _labels_read(5, save=whole)
    _labels_read(3, save=first)
    _labels_read(2, restore=first, save=second)
    assert saved(second) == saved(whole)
    assert saved(whole)["global_batches/batches_read"] == 5


@pytest.mark.parametrize("augment", [
    lambda example, seed: (tf.image.random_flip_left_right(example[0]), example[1]),
    lambda example, seed: (example[0] + tf.random.uniform(tf.shape(example[0])), example[1])])
def test_an_augment_with_stateful_random_ops_is_refused_in_one_line(augment):
    """Its draws would differ between two runs of one seed (the docs promise they don't)."""
    arrays = (np.zeros((10, 4, 4, 3), np.float32), np.zeros(10, np.int32))
    with tf.Graph().as_default(), pytest.raises(ValueError) as refused:
        towerlib.global_batch_input(arrays, 4, seed=1, augment=augment)
    message = str(refused.value)
    assert "\n" not in message and "augment uses RandomUniform" in message, message
    assert "stateless_random_flip_left_right(image, seed)" in message

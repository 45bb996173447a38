"""towerlib.saved_position_iterator: a restarted run_training reads on where it stopped.

A run_training user's own tf.data pipeline (shuffled, with stateless random
augmentation) is stopped at step 4 and resumed to step 8: the final weights,
slots and global_step equal an uninterrupted run's bit for bit. With a plain
iterator the resumed run re-reads the start of its data and ends elsewhere.
"""

import numpy as np
import pytest
import tensorflow as tf

import towerlib
from tests.fault_scripts import tiny_model
from towerlib import layers

GLOBAL_BATCH = 8


def _pipeline(seed):
    """32 examples, shuffled each epoch, a stateless random sign flip per example."""
    features = np.random.default_rng(0).normal(size=[32, 6]).astype(np.float32)
    labels = np.arange(32, dtype=np.int32) % 3
    records = tf.data.Dataset.from_tensor_slices((features, labels))
    records = records.shuffle(32, seed=seed, reshuffle_each_iteration=True).repeat()
    seeds = tf.data.Dataset.random(seed=seed).batch(2)

    def augment(record, element_seed):
        x, y = record
        sign = tf.where(tf.random.stateless_uniform([], element_seed) < 0.5, -1.0, 1.0)
        return x * sign, y

    dataset = tf.data.Dataset.zip((records, seeds)).map(augment, num_parallel_calls=2, deterministic=True)
    return dataset.batch(GLOBAL_BATCH, drop_remainder=True).prefetch(2)


def _tower_fn(inputs, ctx):
    x, y = inputs
    hidden = layers.dense(x, 8, name="hidden")
    logits = layers.dense(tf.nn.relu(hidden), 3, name="logits")
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=y, logits=logits))


def _train(train_dir, max_steps, saved_position=True):
    with tf.Graph().as_default():
        towerlib.seed_everything(3)
        with tf.device("/device:CPU:0"):
            dataset = _pipeline(seed=5)
            if saved_position:
                iterator = towerlib.saved_position_iterator(dataset)
            else:
                iterator = tf.compat.v1.data.make_one_shot_iterator(dataset)
            inputs = iterator.get_next()
        optimizer = tf.compat.v1.train.MomentumOptimizer(0.1, 0.9)
        graph = towerlib.build_train_graph(_tower_fn, inputs, optimizer, num_towers=2)
        towerlib.run_training(graph, train_dir=train_dir, max_steps=max_steps,
                              session_config=tiny_model.session_config(2),
                              save_checkpoint_steps=2, log_every_n_steps=100,
                              save_summaries_steps=None)
    return checkpoint_values(f"{train_dir}/model.ckpt-{max_steps}")


def checkpoint_values(prefix):
    """{name: value} of a checkpoint's tensors; a variant (the data position) as None,
    NumPy having no type for it."""
    reader = tf.train.load_checkpoint(prefix)
    dtypes = reader.get_variable_to_dtype_map()
    return {name: None if dtypes[name] == tf.variant else reader.get_tensor(name)
            for name in dtypes}


def _assert_same_model(actual, expected):
    names = [n for n in expected if "Iterator" not in n]
    assert any("Momentum" in n for n in names) and "global_step" in names
    for name in names:
        np.testing.assert_array_equal(actual[name], expected[name], err_msg=name)


REPLAY_WARNING = "starts from its beginning: its position is not in the checkpoint"


def replay_warnings(caplog):
    return [r.getMessage() for r in caplog.records if REPLAY_WARNING in r.getMessage()]


def test_resumed_run_reads_on_and_matches_an_uninterrupted_run(tmp_path, caplog):
    expected = _train(str(tmp_path / "straight"), 8)
    _train(str(tmp_path / "resumed"), 4)
    resumed = _train(str(tmp_path / "resumed"), 8)
    assert any("Iterator" in name for name in resumed)  # the position is saved
    _assert_same_model(resumed, expected)
    assert replay_warnings(caplog) == []


def test_without_the_saved_position_the_resumed_run_replays_its_data(tmp_path, caplog):
    expected = _train(str(tmp_path / "straight"), 8, saved_position=False)
    _train(str(tmp_path / "resumed"), 4, saved_position=False)
    assert replay_warnings(caplog) == []  # nothing restored yet: nothing replayed
    resumed = _train(str(tmp_path / "resumed"), 8, saved_position=False)
    assert not np.array_equal(resumed["hidden/weights"], expected["hidden/weights"])
    # ... and the run said so, once, when it started, naming the fix.
    (warning,) = replay_warnings(caplog)
    assert "model.ckpt-4" in warning and "OneShotIterator" in warning
    assert "towerlib.saved_position_iterator(dataset)" in warning


def test_a_stateful_random_op_is_refused_with_the_fix():
    with tf.Graph().as_default():
        dataset = tf.data.Dataset.range(10).map(
            lambda x: tf.cast(x, tf.float32) + tf.random.uniform([]))
        with pytest.raises(towerlib.DataPositionError,
                           match=r"stateful.*Fix: use stateless random ops"):
            towerlib.saved_position_iterator(dataset)

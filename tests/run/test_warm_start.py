"""warm_start_from: a fresh run's model variables start from a checkpoint or a Keras file,
renamed as asked, never the optimizer's slots or the global step; a resume ignores it."""

import logging

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import towerlib
from tests.keras import keras_models as km


def build(model):
    images, labels = km.batch(8)
    tower = towerlib.KerasTower(model, km.sparse_cross_entropy)
    return towerlib.build_train_graph(
        tower, (tf.constant(images), tf.constant(labels)),
        tf.compat.v1.train.MomentumOptimizer(0.1, 0.9), num_towers=2,
        update=towerlib.Replicated(), bn_mode="sync")


def renamed_head():
    """keras_functional's network, its Dense layer named 'head'."""
    model = km.keras_functional(km.initial_weights(seed=3))
    inputs = tf_keras.Input((8, 8, 3))
    features = tf_keras.Model(model.input, model.get_layer("logits").input)(inputs)
    const = tf_keras.initializers.Constant(km.initial_weights(seed=3)["logits/kernel"])
    head = tf_keras.layers.Dense(km.CLASSES, name="head", kernel_initializer=const)
    return tf_keras.Model(inputs, head(features))


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """(a trained run's checkpoint prefix, its values, a Keras .h5 file of other values)."""
    folder = tmp_path_factory.mktemp("base")
    with tf.Graph().as_default():
        result = towerlib.run_training(build(km.keras_functional), train_dir=str(folder / "run"),
                                       max_steps=2, save_summaries_steps=None)
    reader = tf.train.load_checkpoint(result.checkpoint)
    values = {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map()}
    keras_model = km.keras_functional(km.initial_weights(seed=11))
    keras_model.save_weights(str(folder / "base.h5"))
    return result.checkpoint, values, str(folder / "base.h5"), keras_model


def step_0(train_dir):
    reader = tf.train.load_checkpoint(str(train_dir / "model.ckpt-0"))
    return {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map()}


def test_a_fresh_run_starts_from_the_checkpoints_model_variables_renamed(base, tmp_path,
                                                                       caplog):
    prefix, trained, _, _ = base
    with tf.Graph().as_default(), caplog.at_level(logging.INFO, "towerlib"):
        towerlib.run_training(
            build(renamed_head), train_dir=str(tmp_path), max_steps=1,
            save_summaries_steps=None,
            warm_start_from=towerlib.WarmStart(prefix, names={"head/kernel": "logits/kernel"},
                                               include=r"^(?!bn/beta)"))
    got = step_0(tmp_path)
    for name in ("conv/kernel", "conv/bias", "bn/gamma", "bn/moving_mean"):
        np.testing.assert_array_equal(got[name], trained[name], err_msg=name)
    np.testing.assert_array_equal(got["head/kernel"], trained["logits/kernel"])
    fresh = km.initial_weights(seed=3)
    np.testing.assert_array_equal(got["bn/beta"], fresh["bn/beta"])  # not included
    np.testing.assert_array_equal(got["head/bias"], fresh["logits/bias"])  # not mapped
    assert got["global_step"] == 0
    assert not np.any(got["conv/kernel/Momentum"])  # slots start at zero, not restored
    (line,) = [r.getMessage() for r in caplog.records if "Warm start from" in r.getMessage()]
    assert "8 variable(s) loaded" in line and "head/kernel <- logits/kernel" in line
    assert "2 left at their initializer (bn/beta, head/bias)" in line


def test_a_keras_weights_file_warm_starts_and_a_resume_ignores_it(base, tmp_path, caplog):
    _, _, h5, keras_model = base
    want = {w.name.split(":")[0]: w.numpy() for w in keras_model.weights}
    with tf.Graph().as_default():
        towerlib.run_training(build(km.keras_functional), train_dir=str(tmp_path),
                              max_steps=1, save_summaries_steps=None, warm_start_from=h5)
    got = step_0(tmp_path)
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)
    with tf.Graph().as_default(), caplog.at_level(logging.INFO, "towerlib"):
        result = towerlib.run_training(build(km.keras_functional), train_dir=str(tmp_path),
                                       max_steps=2, save_summaries_steps=None,
                                       warm_start_from=h5)
    assert result.global_step == 2
    assert any("warm_start_from=" in r.getMessage() and "is not used" in r.getMessage()
               for r in caplog.records)


def test_a_source_that_is_neither_format_is_refused_before_anything_runs(tmp_path):
    with tf.Graph().as_default(), pytest.raises(towerlib.ConfigError,
                                                match="warm_start_from.*neither a TF"):
        towerlib.run_training(build(km.keras_functional), train_dir=str(tmp_path),
                              max_steps=1, warm_start_from=str(tmp_path / "nothing"))


def test_a_run_from_another_runs_checkpoint_is_called_a_new_run_not_a_resume(tmp_path,
                                                                            caplog):
    """A phase 2 restoring phase 1's checkpoint into a new train_dir, its input a plain
    iterator: no 'Resuming ... does not end where an uninterrupted run would'."""
    images, labels = km.batch(32)

    def phase(train_dir, max_steps, restore_from=None):
        with tf.Graph().as_default():
            batch = tf.compat.v1.data.make_one_shot_iterator(
                tf.data.Dataset.from_tensor_slices((images, labels)).repeat().batch(8)
            ).get_next()
            train = towerlib.build_train_graph(
                towerlib.KerasTower(km.keras_functional, km.sparse_cross_entropy), batch,
                tf.compat.v1.train.GradientDescentOptimizer(0.1), num_towers=2)
            return towerlib.run_training(train, train_dir=str(train_dir), max_steps=max_steps,
                                         restore_from=restore_from, save_summaries_steps=None)

    first = phase(tmp_path / "head", 1)
    with caplog.at_level(logging.INFO, "towerlib"):
        assert phase(tmp_path / "top", 2, restore_from=first.checkpoint).global_step == 2
    said = [r.getMessage() for r in caplog.records]
    assert not [line for line in said if line.startswith("Resuming")]
    assert [line for line in said if line.startswith("A new run in ")
            and "not a resume" in line and "starts from its beginning" in line]

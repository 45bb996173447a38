"""Weights a tf_keras model holds when the step is built are its step-0 values, bit for bit.

In a graph, tf_keras assigns loaded weights in its own session; towerlib makes
them the variables' initial values, under every update and bn_mode, in every
replicated copy, and in the checkpoint run_training writes at step 0.
"""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import towerlib
from tests.keras import keras_models as km


def small_model(seed):
    tf_keras.utils.set_random_seed(seed)
    inputs = tf_keras.Input((8, 8, 3))
    h = tf_keras.layers.Conv2D(6, 3, name="conv")(inputs)
    h = tf_keras.layers.BatchNormalization(name="bn")(h)
    h = tf_keras.layers.GlobalAveragePooling2D()(h)
    return tf_keras.Model(inputs, tf_keras.layers.Dense(5, name="logits")(h))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(a .h5 weights file, a TF checkpoint prefix, the file's values loaded by tf_keras
    into a fresh model on one device, by weight name)."""
    folder = tmp_path_factory.mktemp("held")
    model = small_model(1)
    model.get_layer("bn").set_weights([np.full(6, v, np.float32) for v in (2.0, .5, .3, 4.)])
    model.save_weights(str(folder / "w.h5"))
    model.save_weights(str(folder / "ckpt"))
    fresh = small_model(2)
    fresh.load_weights(str(folder / "w.h5"))
    return str(folder / "w.h5"), str(folder / "ckpt"), {
        w.name.split(":")[0]: w.numpy() for w in fresh.weights}


def holding(how, h5, prefix, values):
    """The model (or model function) holding the saved values by `how`."""
    def loaded(source):
        model = small_model(3)
        model.load_weights(source)
        return model

    def set_weights():
        model = small_model(3)
        # by the Keras name (a replicated copy's variables are 'replicated/tower_1/...')
        model.set_weights([values["/".join(w.name.split(":")[0].split("/")[-2:])]
                           for w in model.weights])
        return model

    return {"load_weights in the model function": lambda: loaded(h5),
            "a checkpoint in the model function": lambda: loaded(prefix),
            "load_weights on the model object": lambda: loaded(h5),
            "set_weights on the model object": lambda: set_weights(),
            "set_weights in the model function": set_weights,
            }[how]


def step_zero_values(model, update, bn_mode):
    images, labels = km.batch(8)
    tower = towerlib.KerasTower(model, km.sparse_cross_entropy)
    train = towerlib.build_train_graph(
        tower, (tf.constant(images), tf.constant(labels)),
        tf.compat.v1.train.MomentumOptimizer(0.1, 0.9), num_towers=2, update=update,
        bn_mode=bn_mode)
    with tf.compat.v1.Session(config=towerlib.session_config(2)) as session:
        train.initialize(session)
        variables = tf.compat.v1.global_variables() + tf.compat.v1.local_variables()
        return dict(zip([v.op.name for v in variables], session.run(variables)))


@pytest.mark.parametrize("how", ["load_weights in the model function",
                                 "a checkpoint in the model function",
                                 "load_weights on the model object",
                                 "set_weights on the model object",
                                 "set_weights in the model function"])
@pytest.mark.parametrize("update", [towerlib.ParameterServer(), towerlib.Replicated()],
                         ids=["parameter_server", "replicated"])
@pytest.mark.parametrize("bn_mode", ["first_tower", "sync"])
def test_held_weights_are_the_step_0_values_of_every_copy(saved, how, update, bn_mode):
    h5, prefix, want = saved
    with tf.Graph().as_default():
        made = holding(how, h5, prefix, want)
        model = made() if "object" in how else made
        got = step_zero_values(model, update, bn_mode)
    for name, value in want.items():
        copies = [n for n in got if n == name or n.endswith("/" + name)
                  and n.startswith("replicated/")]
        assert len(copies) == (2 if isinstance(update, towerlib.Replicated) else 1), copies
        for copy in copies:
            np.testing.assert_array_equal(got[copy], value, err_msg=copy)


@pytest.mark.slow  # MobileNetV2 built three times and a run: ~60 s on 2 shared cores
def test_applications_weights_file_is_the_step_0_checkpoint_of_run_training(tmp_path):
    """MobileNetV2(weights=<a local .h5>) through run_training: model.ckpt-0 holds the file."""
    def mobilenet(weights):
        return tf_keras.applications.MobileNetV2(weights=weights, input_shape=(32, 32, 3),
                                                 classes=4, alpha=0.35)

    path = str(tmp_path / "base.h5")
    mobilenet(None).save_weights(path)
    want = {w.name.split(":")[0]: w.numpy() for w in mobilenet(path).weights}
    rng = np.random.RandomState(0)
    with tf.Graph().as_default():
        tower = towerlib.KerasTower(lambda: mobilenet(path), km.sparse_cross_entropy)
        batch = (tf.constant(rng.randn(4, 32, 32, 3).astype(np.float32)),
                 tf.constant(rng.randint(0, 4, 4).astype(np.int32)))
        train = towerlib.build_train_graph(
            tower, batch, tf.compat.v1.train.GradientDescentOptimizer(0.01), num_towers=2,
            update=towerlib.Replicated(), bn_mode="sync")
        towerlib.run_training(train, train_dir=str(tmp_path / "run"), max_steps=1,
                              save_summaries_steps=None)
    reader = tf.train.load_checkpoint(str(tmp_path / "run" / "model.ckpt-0"))
    for name, value in want.items():
        np.testing.assert_array_equal(reader.get_tensor(name), value, err_msg=name)

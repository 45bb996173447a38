"""A Keras model trained through towerlib saves and loads as Keras' own; channels-first
batch norm follows bn_mode like channels-last."""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import towerlib
from tests.keras import keras_models as km


def test_weights_saved_by_keras_after_towerlib_training_load_into_a_new_model(tmp_path):
    images, labels = km.batch(9)
    path = str(tmp_path / "weights.h5")
    with tf.Graph().as_default():
        tower = towerlib.KerasTower(km.keras_functional, km.sparse_cross_entropy)
        train = towerlib.build_train_graph(
            tower, (tf.constant(images), tf.constant(labels)), km.optimizer("momentum"),
            num_towers=2, bn_mode="sync", update=towerlib.Replicated())
        model = tower.model()
        with tf.compat.v1.Session(config=towerlib.session_config(2)) as session:
            train.initialize(session)
            for _ in range(3):
                session.run(train.train_op)
            trained = session.run(model.weights)
            with session.as_default():
                model.save_weights(path)
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        fresh = km.keras_functional(km.initial_weights(seed=99))
        session.run(tf.compat.v1.global_variables_initializer())
        with session.as_default():
            fresh.load_weights(path)
        loaded = session.run(fresh.weights)
    assert [w.name for w in fresh.weights] == [w.name for w in model.weights]
    for got, want in zip(loaded, trained):
        np.testing.assert_array_equal(got, want)
    assert np.abs(trained[4]).max() > 0  # bn/moving_mean trained


def channels_first_model():
    inputs = tf_keras.Input((3, 4, 4))  # [N, C, H, W]
    h = tf_keras.layers.BatchNormalization(axis=1, name="bn", momentum=0.5)(inputs)
    h = tf_keras.layers.Flatten()(h)
    outputs = tf_keras.layers.Dense(
        2, name="logits", kernel_initializer=tf_keras.initializers.Constant(0.1))(h)
    return tf_keras.Model(inputs, outputs)


def towerlib_channels_first(inputs, ctx):
    x, y = inputs
    h = towerlib.batch_norm(x, ctx, name="bn", axis=1, momentum=0.5, epsilon=1e-3)
    logits = tf.matmul(tf.reshape(h, [-1, 48]), tf.compat.v1.get_variable(
        "logits/kernel", [48, 2], initializer=tf.compat.v1.constant_initializer(0.1)))
    logits += tf.compat.v1.get_variable("logits/bias", [2],
                                        initializer=tf.compat.v1.zeros_initializer())
    return tf.reduce_mean(km.sparse_cross_entropy(y, logits))


@pytest.mark.parametrize("bn_mode", ["first_tower", "all_towers", "sync"])
def test_channels_first_batch_norm_follows_the_mode(bn_mode):
    rng = np.random.RandomState(2)
    x = (rng.randn(7, 3, 4, 4) * 2 + 1).astype(np.float32)
    y = rng.randint(0, 2, 7).astype(np.int32)
    results = []
    for make in (lambda: towerlib.KerasTower(channels_first_model, km.sparse_cross_entropy),
                 lambda: towerlib_channels_first):
        with tf.Graph().as_default():
            train = towerlib.build_train_graph(
                make(), (tf.constant(x), tf.constant(y)), km.optimizer("momentum"),
                num_towers=2, bn_mode=bn_mode)
            # The moving variance is tf_keras' own (Bessel-corrected) for the Keras layer,
            # held to tf_keras in test_keras_as_keras; towerlib.batch_norm's is biased.
            names = ("bn/gamma", "bn/beta", "bn/moving_mean", "logits/kernel")
            variables = {v.op.name: v for v in tf.compat.v1.global_variables()
                         if v.op.name in names}
            with tf.compat.v1.Session(config=towerlib.session_config(2)) as session:
                train.initialize(session)
                for _ in range(3):
                    session.run(train.train_op)
                results.append(session.run(variables))
    assert sorted(results[0]) == sorted(results[1])
    for name in results[0]:
        np.testing.assert_allclose(results[0][name], results[1][name], atol=1e-6,
                                   err_msg=name)
    assert np.abs(results[0]["bn/moving_mean"]).max() > 0.1

"""Misuses of the API that used to train silently or fail deep in TensorFlow."""

import numpy as np
import pytest
import tensorflow as tf

import towerlib
from tests import helpers
from towerlib import layers


def test_a_loss_of_unknown_rank_that_is_a_vector_fails_at_the_first_step():
    def model(inputs, ctx):
        images, labels = inputs
        logits = layers.dense(layers.flatten(images), 3, name="logits")
        per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=labels, logits=logits)
        return tf.compat.v1.placeholder_with_default(per_example, shape=None)  # rank unknown

    with tf.Graph().as_default():
        train = helpers.build_on_image_batch(2, tower_fn=model)
        with tf.compat.v1.Session(config=towerlib.session_config(2)) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            with pytest.raises(tf.errors.InvalidArgumentError, match="loss must be a scalar"):
                session.run(train.train_op)
            assert session.run(train.global_step) == 0


@pytest.mark.parametrize("bn_mode", ["first_tower", "all_towers"])
def test_batch_norm_in_some_towers_only_is_refused(bn_mode):
    def model(inputs, ctx):
        images, labels = inputs
        h = layers.conv2d(images, 4, 3, name="conv1")
        if ctx.index == 0:
            h = towerlib.batch_norm(h, ctx, name="bn1")
        logits = layers.dense(layers.flatten(h), 3, name="logits")
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=labels, logits=logits))

    with tf.Graph().as_default():
        with pytest.raises(ValueError, match=r"'bn1' was built by towers \[0\].*\[1\]"):
            helpers.build_on_image_batch(2, tower_fn=model, bn_mode=bn_mode)


@pytest.mark.parametrize("devices", [["/device:CPU:0", "/device:CPU:5"],
                                     [f"/device:CPU:{i}" for i in range(4)],
                                     ["/device:GPU:0", "/device:GPU:1"]])
def test_run_training_refuses_towers_on_devices_the_session_lacks(tmp_path, devices):
    with tf.Graph().as_default():
        train = helpers.build_on_image_batch(devices=devices)
        with pytest.raises(towerlib.ConfigError,
                           match=r"devices: devices\[\d\] = '/device:[CG]PU:[1-5]'"):
            towerlib.run_training(train, train_dir=str(tmp_path), max_steps=1,
                                  session_config=towerlib.session_config(2),
                                  save_summaries_steps=None)


def test_own_sessions_can_ask_which_tower_devices_are_missing():
    with tf.Graph().as_default():
        with tf.compat.v1.Session(config=towerlib.session_config(2)) as session:
            assert towerlib.missing_tower_devices(
                session, ["/device:CPU:0", "/device:CPU:1"]) == []
            assert towerlib.missing_tower_devices(
                session, ["/device:CPU:0", "/device:CPU:5", "/device:GPU:0"]) == [
                    (1, "/device:CPU:5"), (2, "/device:GPU:0")]


@pytest.mark.parametrize("dtype", [np.uint8, np.float64, np.int32])
def test_layers_refuse_inputs_they_cannot_compute_in(dtype):
    with tf.Graph().as_default():
        images = tf.constant(np.zeros([2, 4, 4, 3], dtype))
        with pytest.raises(TypeError, match=f"conv2d 'conv1' got .* {tf.as_dtype(dtype).name}"
                                            r".*tf.cast\(images, tf.float32\)"):
            layers.conv2d(images, 4, 3, name="conv1")
        with pytest.raises(TypeError, match="dense 'fc'"):
            layers.dense(tf.reshape(images, [2, -1]), 3, name="fc")


def test_embedding_refuses_float_ids():
    with tf.Graph().as_default():
        with pytest.raises(TypeError, match="integer ids"):
            layers.embedding(tf.constant([[1.0, 2.0]]), 10, 4, name="embed")


def test_pooling_strides_default_to_the_pool_size():
    """Layers.max_pool2d(h, 2) as in other layer libraries."""
    with tf.Graph().as_default():
        h = tf.zeros([1, 8, 8, 3])
        assert layers.max_pool2d(h, 2).shape.as_list() == [1, 4, 4, 3]
        assert layers.avg_pool2d(h, 2).shape.as_list() == [1, 4, 4, 3]
        assert layers.max_pool2d(h, 3, strides=1).shape.as_list() == [1, 8, 8, 3]


def test_device_type_that_disagrees_with_the_devices_given_is_refused():
    """Devices=[CPU:0, CPU:1] with device_type='gpu' ignored the type."""
    def tower(x, ctx):
        w = tf.compat.v1.get_variable("w", [2], initializer=tf.zeros_initializer())
        return tf.reduce_mean(x * w)
    with tf.Graph().as_default():
        with pytest.raises(ValueError, match=r"device_type is 'gpu' but devices\[0\] = "
                           r"'/device:CPU:0' is a CPU: .* Fix: drop device_type"):
            towerlib.build_train_graph(
                tower, tf.ones([4, 2]), tf.compat.v1.train.GradientDescentOptimizer(0.1),
                devices=["/device:CPU:0", "/device:CPU:1"], device_type="gpu")
        train = towerlib.build_train_graph(
            tower, tf.ones([4, 2]), tf.compat.v1.train.GradientDescentOptimizer(0.1),
            devices=["/device:CPU:0", "/device:CPU:1"], device_type="cpu")
        assert len(train.devices) == 2

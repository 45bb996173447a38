"""What towerlib cannot do with a Keras model is refused while building, in one line."""

import keras
import pytest
import tensorflow as tf
import tf_keras

import towerlib
from tests.keras import keras_models as km


def _build(tower, num_towers=2, update=None, optimizer=None, bn_mode="first_tower"):
    images, labels = km.batch(6)
    return towerlib.build_train_graph(
        tower, (tf.constant(images), tf.constant(labels)),
        optimizer or km.optimizer("momentum"), num_towers=num_towers, bn_mode=bn_mode,
        update=update or towerlib.ParameterServer())


def first_line(error):
    return str(error.value).splitlines()[0]


def test_a_keras_3_model_is_refused_naming_tf_keras():
    with tf.Graph().as_default():
        model = keras.Sequential([keras.layers.Dense(3)])
        with pytest.raises(TypeError) as error:
            towerlib.KerasTower(model, km.sparse_cross_entropy)
    assert "Keras 3 model" in first_line(error) and "tf_keras" in first_line(error)


@pytest.mark.parametrize("make", [lambda: tf_keras.optimizers.Adam(0.01),
                                  lambda: tf_keras.optimizers.SGD(0.1, momentum=0.9),
                                  lambda: keras.optimizers.Adam(0.01)])
def test_a_keras_optimizer_is_refused_naming_the_tf1_equivalent(make):
    with tf.Graph().as_default():
        optimizer = make()
        with pytest.raises(TypeError) as error:
            _build(towerlib.KerasTower(km.keras_functional(), km.sparse_cross_entropy),
                   optimizer=optimizer)
    line = first_line(error)
    name = type(optimizer).__name__
    assert f"Keras {name}" in line and "tf.compat.v1.train." in line


@pytest.mark.parametrize("option", [dict(renorm=True), dict(virtual_batch_size=2),
                                    dict(axis=[1, 3])])
def test_a_batch_norm_option_towerlib_cannot_honour_is_refused_naming_the_layer(option):
    with tf.Graph().as_default():
        model = tf_keras.Sequential([
            tf_keras.layers.Conv2D(4, 3, input_shape=(8, 8, 3)),
            tf_keras.layers.BatchNormalization(name="odd_bn", **option),
            tf_keras.layers.Flatten(), tf_keras.layers.Dense(km.CLASSES)])
        with pytest.raises(towerlib.KerasBatchNormError) as error:
            _build(towerlib.KerasTower(model, km.sparse_cross_entropy), bn_mode="sync")
    assert "'odd_bn'" in first_line(error) and "Fix:" in first_line(error)


class Subclassed(tf_keras.Model):
    def __init__(self):
        super().__init__(name="subclassed")
        self.conv = tf_keras.layers.Conv2D(4, 3, name="conv")
        self.bn = tf_keras.layers.BatchNormalization(name="bn")
        self.drop = tf_keras.layers.Dropout(0.5)
        self.out = tf_keras.layers.Dense(km.CLASSES, name="logits")

    def call(self, x, training=None):
        h = tf.nn.relu(self.bn(self.conv(x), training=training))
        return self.out(self.drop(tf.reduce_mean(h, axis=[1, 2]), training=training))


def test_a_subclassed_model_object_under_replicated_asks_for_a_function():
    with tf.Graph().as_default():
        with pytest.raises(ValueError) as error:
            _build(towerlib.KerasTower(Subclassed(), km.sparse_cross_entropy),
                   update=towerlib.Replicated())
    assert "pass a function that builds it" in first_line(error)


def test_a_model_of_another_graph_asks_for_a_function():
    with tf.Graph().as_default():
        model = km.keras_functional()
    with tf.Graph().as_default():
        with pytest.raises(ValueError) as error:
            _build(towerlib.KerasTower(model, km.sparse_cross_entropy))
    assert "built in another graph" in first_line(error)


@pytest.mark.parametrize("update", [towerlib.ParameterServer, towerlib.Replicated])
def test_a_subclassed_model_from_a_function_trains_with_dropout_and_keras_names(update):
    with tf.Graph().as_default():
        train = _build(towerlib.KerasTower(Subclassed, km.sparse_cross_entropy),
                       update=update(), bn_mode="all_towers")
        names = sorted(v.op.name for v in tf.compat.v1.global_variables()
                       if "Momentum" not in v.op.name and v.op.name != "global_step")
        dropout_ops = [op for op in tf.compat.v1.get_default_graph().get_operations()
                       if op.name.startswith("tower_1/") and "dropout" in op.name
                       and op.type == "RandomUniform"]
        (moving_mean,) = [v for v in tf.compat.v1.global_variables()
                          if v.op.name == "subclassed/bn/moving_mean"]
        with tf.compat.v1.Session(config=towerlib.session_config(2)) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(tf.compat.v1.local_variables_initializer())
            before = session.run(moving_mean)
            for _ in range(2):
                session.run(train.train_op)
            after = session.run(moving_mean)
    assert names == ["subclassed/bn/beta", "subclassed/bn/gamma", "subclassed/bn/moving_mean",
                     "subclassed/bn/moving_variance", "subclassed/conv/bias",
                     "subclassed/conv/kernel", "subclassed/logits/bias",
                     "subclassed/logits/kernel"]
    assert dropout_ops  # training=True reached the dropout layer of every tower
    assert abs(after - before).max() > 1e-4


IMPORTED_IN_THE_TOWER = r"""
import sys
import numpy as np
import tensorflow as tf
import towerlib
assert "tf_keras" not in sys.modules

def tower(inputs, ctx):
    import tf_keras  # first imported here, after towerlib routed tower 0's batch norm
    x, y = inputs
    h = tf_keras.layers.BatchNormalization(name="late_bn")(x, training=True)
    return tf.reduce_mean(tf.square(h))

with tf.Graph().as_default():
    batch = (tf.constant(np.ones([4, 3], np.float32)), tf.constant(np.ones([4], np.int32)))
    try:
        towerlib.build_train_graph(tower, batch, tf.compat.v1.train.GradientDescentOptimizer(
            0.1), num_towers=2, bn_mode="first_tower")
    except towerlib.KerasBatchNormError as error:
        print("REFUSED:", str(error).splitlines()[0])
"""


@pytest.mark.slow  # a fresh Python, where tf_keras is not imported yet
def test_tf_keras_first_imported_inside_a_tower_is_refused_not_left_frozen():
    import subprocess
    import sys
    completed = subprocess.run([sys.executable, "-c", IMPORTED_IN_THE_TOWER],
                               capture_output=True, text=True, timeout=240)
    assert "REFUSED: tf_keras was first imported while tower 0" in completed.stdout, (
        completed.stderr[-2000:])

"""Mistakes TensorFlow reports deep in its stack, named first in one line."""

import pytest
import tensorflow as tf

import towerlib
from tests import helpers


def first_line(error):
    return str(error.value).splitlines()[0]


def test_a_device_function_without_the_op_argument():
    with pytest.raises(TypeError) as error:
        towerlib.ParameterServer(device=lambda: "/cpu:0")
    assert "does not take one argument" in first_line(error) and "Fix:" in first_line(error)
    towerlib.ParameterServer(device=lambda op: "/cpu:0")  # the right signature passes


def test_building_under_eager_execution():
    assert tf.executing_eagerly()
    with pytest.raises(RuntimeError) as error:
        helpers.build_on_image_batch(2)
    assert "tf.Graph().as_default()" in first_line(error)


def test_building_twice_in_one_graph_names_the_variable_and_the_fixes():
    with tf.Graph().as_default():
        helpers.build_on_image_batch(2)
        with pytest.raises(ValueError) as error:
            helpers.build_on_image_batch(2)
    assert first_line(error).startswith("Variable conv1/weights already exists in this graph")


def test_the_tutorials_float_global_step_is_named():
    with tf.Graph().as_default():
        tf.compat.v1.get_variable("global_step", [], trainable=False,
                                  initializer=tf.compat.v1.zeros_initializer())
        with pytest.raises(TypeError) as error:
            helpers.build_on_image_batch(2)
    assert "get_or_create_global_step()" in first_line(error)


def test_a_learning_rate_given_as_text():
    with tf.Graph().as_default():
        images, labels = (tf.constant(x) for x in helpers.image_batch(4))
        with pytest.raises(TypeError) as error:
            towerlib.build_train_graph(helpers.conv_bn_model, (images, labels),
                                       tf.compat.v1.train.MomentumOptimizer("0.1", 0.9),
                                       num_towers=2)
    assert "the string '0.1'" in first_line(error)


def test_an_empty_var_list_says_so():
    with tf.Graph().as_default():
        with pytest.raises(ValueError) as error:
            helpers.build_on_image_batch(2, var_list=[])
    assert first_line(error).startswith("var_list is empty")


@pytest.mark.parametrize("make", [
    lambda x: towerlib.layers.conv2d(x, 4, 3, name=None),
    lambda x: towerlib.layers.dense(tf.reshape(x, [2, -1]), 4, name=""),
    lambda x: towerlib.layers.embedding(tf.zeros([2], tf.int32), 5, 3, name=7),
])
def test_a_layer_without_a_name_names_the_argument(make):
    with tf.Graph().as_default():
        with pytest.raises(TypeError, match=r"^(conv2d|dense|embedding): name must be a "
                           r"non-empty string, got .*every tower must spell alike"):
            make(tf.zeros([2, 8, 8, 3]))

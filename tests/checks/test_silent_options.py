"""Options that trained silently into something else, now refused in one line each:
TF 1 optimizers' rates and momentum, what validate_config let through that the build
refuses, a non-bool is_chief, an examples_per_step that is not the batch, LAMB's
vanishing epsilon, schedules past int64 or with an infinite power."""

import math

import numpy as np
import pytest
import tensorflow as tf

import towerlib
from tests import helpers

SGD = tf.compat.v1.train.GradientDescentOptimizer


def build(optimizer=None, **options):
    images, labels = helpers.image_batch(8)
    return towerlib.build_train_graph(
        helpers.conv_dense_model, (tf.constant(images), tf.constant(labels)),
        optimizer or SGD(0.1), devices=helpers.cpu_devices(2), **options)


@pytest.mark.parametrize("make, words", [
    (lambda: SGD(math.nan), "learning rate is nan"),
    (lambda: SGD(-0.1), "learning rate is -0.1"),
    (lambda: tf.compat.v1.train.MomentumOptimizer(0.1, momentum=5), "momentum is 5"),
    (lambda: tf.compat.v1.train.AdamOptimizer(math.inf), "learning rate is inf")])
def test_a_tf1_optimizer_with_a_rate_or_momentum_that_cannot_train_is_refused(make, words):
    with tf.Graph().as_default(), pytest.raises(ValueError, match=words):
        build(make())
    with tf.Graph().as_default(), pytest.raises(towerlib.ConfigError, match=words):
        towerlib.validate_config(optimizer=make())


@pytest.mark.parametrize("option, value, words", [
    ("var_list", [], "var_list is empty"),
    ("var_list", [1, 2], "var_list holds int values"),
    ("global_step", "a tensor", "global_step must be a step variable"),
    ("learning_rate", "0.1", "learning_rate is the string '0.1'")])
def test_validate_config_refuses_what_the_build_refuses(option, value, words):
    with tf.Graph().as_default():
        if value == "a tensor":
            value = tf.constant(0, tf.int64)
        with pytest.raises(towerlib.ConfigError) as validated:
            towerlib.validate_config(**{option: value})
        assert words in str(validated.value)
        with pytest.raises((TypeError, ValueError), match=words):
            build(**{option: value})


def test_validate_config_refuses_an_is_chief_that_is_no_bool():
    with pytest.raises(towerlib.ConfigError, match="is_chief: is 'False', not True or False"):
        towerlib.validate_config(is_chief="False", master="grpc://localhost:1")


def test_examples_per_step_other_than_the_static_batch_is_refused(tmp_path):
    with tf.Graph().as_default():
        train = build()
        with pytest.raises(towerlib.ConfigError, match="examples_per_step: is 3 but "
                                                       "global_batch_size is 8"):
            towerlib.run_training(train, train_dir=str(tmp_path), max_steps=1,
                                  examples_per_step=3)
    assert not list(tmp_path.iterdir())  # refused before anything was written


def test_lamb_refuses_an_epsilon_float32_makes_zero():
    with pytest.raises(ValueError, match="epsilon >= 1.18e-38"):
        towerlib.optimizers.LAMBOptimizer(0.1, epsilon=1e-50)


@pytest.mark.parametrize("make", [
    lambda: towerlib.schedules.PiecewiseConstant([2**63]),
    lambda: towerlib.schedules.PolynomialDecay(100, power=math.inf)])
def test_a_schedule_past_int64_or_with_an_infinite_power_is_refused(make):
    with pytest.raises(ValueError):
        make()


@pytest.mark.parametrize("option, value, words", [
    ("max_checkpoints_to_keep", None, "max_checkpoints_to_keep: must be an int >= 1"),
    ("restore_from", 5, "restore_from: must be 'newest', a checkpoint prefix or None"),
    ("master", 5, "master: must be a session target string")])
def test_loop_options_of_the_wrong_type_are_named_before_anything_runs(option, value, words):
    with pytest.raises(towerlib.ConfigError, match=words):
        towerlib.validate_config(**{option: value})


def test_lars_refuses_a_rate_given_as_a_string():
    with pytest.raises(TypeError, match="learning_rate is the string '0.1'"):
        towerlib.optimizers.LARSOptimizer("0.1")


def test_numpy_bools_are_bools_to_the_step_options():
    # A flag read from an array (np.True_, a mask's element) means what True means.
    with tf.Graph().as_default():
        quiet = build(summaries=np.False_, check_isolation=np.True_)
        assert not tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.SUMMARIES)
        assert quiet.train_op is not None
    with tf.Graph().as_default():
        build(summaries=np.True_)
        assert tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.SUMMARIES)
    with tf.Graph().as_default(), pytest.raises(TypeError, match="summaries must be True"):
        build(summaries=np.int64(1))

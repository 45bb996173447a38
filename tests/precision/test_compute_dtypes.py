"""The towers compute in the build's precision, or the build says where they do not."""

import logging

import pytest
import tensorflow as tf

import towerlib


def own_casts(inputs, ctx):
    """A plain tower that computes its matmul in bfloat16 by casts of its own."""
    images, labels = inputs
    weights = tf.compat.v1.get_variable("w", [4 * 4 * 3, 2])
    flat = tf.reshape(images, [-1, 4 * 4 * 3])
    logits = tf.matmul(tf.cast(flat, tf.bfloat16), tf.cast(weights, tf.bfloat16))
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=labels, logits=tf.cast(logits, tf.float32)))


def float32_by_hand(inputs, ctx):
    """Under a half precision, a tower that casts every weight back to float32."""
    images, labels = inputs
    weights = tf.cast(tf.compat.v1.get_variable("w", [4 * 4 * 3, 2]), tf.float32)
    logits = tf.matmul(tf.cast(tf.reshape(images, [-1, 4 * 4 * 3]), tf.float32), weights)
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=labels, logits=logits))


def build(tower, precision):
    return towerlib.build_train_graph(
        tower, (tf.zeros([4, 4, 4, 3]), tf.zeros([4], tf.int32)),
        tf.compat.v1.train.GradientDescentOptimizer(0.1), num_towers=2, precision=precision)


def test_half_precision_casts_of_your_own_under_float32_build_and_say_so(caplog):
    with tf.Graph().as_default(), caplog.at_level(logging.WARNING, logger="towerlib"):
        build(own_casts, "float32")
    lines = [r.getMessage() for r in caplog.records if "although the build's" in r.getMessage()]
    assert len(lines) == 1 and "1 matmuls or convolutions in bfloat16" in lines[0]


def test_a_half_precision_that_would_change_nothing_is_refused():
    with tf.Graph().as_default():
        with pytest.raises(ValueError, match=r"precision=BFloat16\(\) but tower 0 computes "
                                             r"every matmul and convolution in float32"):
            build(float32_by_hand, "bfloat16")


def test_a_tower_in_the_precision_asked_is_silent(caplog):
    with tf.Graph().as_default(), caplog.at_level(logging.WARNING, logger="towerlib"):
        build(own_casts, "bfloat16")
    assert not [r for r in caplog.records if "matmuls" in r.getMessage()]

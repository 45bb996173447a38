"""The TensorFlow shape errors towerlib.internals.error_texts.is_shape_mismatch knows.

Each test provokes one of TF's build-time shape texts with a per-tower batch
of 32 against a global batch of 128, so a TensorFlow release that rewords one
fails here by name (and towerlib would stop explaining the batch mix-up).
"""

import pytest
import tensorflow as tf

from towerlib.internals import error_texts


def _shape_error(build):
    with tf.Graph().as_default(), pytest.raises(ValueError) as raised:
        build()
    return raised.value


def test_sparse_cross_entropy_labels_and_logits():
    error = _shape_error(lambda: tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=tf.zeros([32], tf.int32), logits=tf.zeros([128, 10])))
    assert error_texts.is_shape_mismatch(error)
    assert "labels.shape=(32,) and logits.shape=(128, 10)" in str(error)


def test_binary_op_and_softmax_cross_entropy_dimensions():
    assert error_texts.is_shape_mismatch(
        _shape_error(lambda: tf.zeros([32, 10]) + tf.zeros([128, 10])))
    assert error_texts.is_shape_mismatch(
        _shape_error(lambda: tf.nn.softmax_cross_entropy_with_logits(
            labels=tf.zeros([32, 10]), logits=tf.zeros([128, 10]))))


def test_concat_dimensions():
    assert error_texts.is_shape_mismatch(_shape_error(
        lambda: tf.concat([tf.zeros([32, 10]), tf.zeros([128, 11])], axis=1)))


def test_reshape_to_a_fixed_first_dimension():
    error = _shape_error(lambda: tf.reshape(tf.zeros([32, 7]), [128, -1]))
    assert error_texts.is_shape_mismatch(error)
    assert "128" in str(error)


def test_reshape_to_a_fixed_shape():
    error = _shape_error(lambda: tf.reshape(tf.zeros([32, 3]), [128, 36]))
    assert error_texts.is_shape_mismatch(error)


def test_v1_losses_shape_compatibility():
    assert error_texts.is_shape_mismatch(_shape_error(
        lambda: tf.compat.v1.losses.mean_squared_error(
            tf.zeros([32, 1]), tf.zeros([128, 1]))))


def test_other_value_errors_are_not_shape_mismatches():
    assert not error_texts.is_shape_mismatch(ValueError("Variable w does not exist"))

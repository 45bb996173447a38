"""What towerlib relies on to find the values a tf_keras model holds in a graph
(towerlib.internals.keras_sessions)."""

import numpy as np
import tensorflow as tf
import tf_keras

from towerlib.internals import keras_sessions


def dense():
    model = tf_keras.Sequential([tf_keras.layers.Dense(2, input_shape=(3,), name="d")])
    return model, [np.full((3, 2), 1.5, np.float32), np.full(2, -2.0, np.float32)]


def test_set_weights_and_h5_loads_go_through_batch_set_value(tmp_path):
    model, values = dense()
    model.set_weights(values)
    model.save_weights(str(tmp_path / "w.h5"))
    with tf.Graph().as_default():
        model, _ = dense()
        with keras_sessions.assignments_captured() as assigned:
            model.load_weights(str(tmp_path / "w.h5"))
        np.testing.assert_array_equal(assigned["d/kernel"], values[0])
        with keras_sessions.assignments_captured() as assigned:
            model.set_weights(values)
        np.testing.assert_array_equal(assigned["d/bias"], values[1])


def test_values_set_in_keras_session_are_flagged_and_read_back():
    with tf.Graph().as_default():
        model, values = dense()
        model.set_weights(values)
        assert keras_sessions.holds_values(model.weights)
        read = keras_sessions.held_values(model.weights)
        np.testing.assert_array_equal(read[0], values[0])


def test_weight_loading_skipped_leaves_the_values_and_is_undone():
    with tf.Graph().as_default():
        model, values = dense()
        model.set_weights(values)
        with keras_sessions.weight_loading_skipped():
            model.set_weights([2 * v for v in values])
            model.load_weights("/nonexistent.h5")
        np.testing.assert_array_equal(keras_sessions.held_values(model.weights)[0], values[0])
        model.set_weights([2 * v for v in values])
        np.testing.assert_array_equal(keras_sessions.held_values(model.weights)[0],
                                      2 * values[0])

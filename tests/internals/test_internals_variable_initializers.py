"""The initializer of a graph variable can be replaced (towerlib.internals.variable_initializers)."""

import numpy as np
import tensorflow as tf

from towerlib.internals import variable_initializers


def test_a_replaced_initializer_assigns_the_given_value_and_is_what_the_init_op_runs():
    with tf.Graph().as_default():
        variable = tf.compat.v1.get_variable("w", [2, 3], use_resource=True)
        held = np.arange(6, dtype=np.float32).reshape(2, 3)
        variable_initializers.replace_initial_value(variable, held)
        copy = tf.compat.v1.get_variable(
            "copy", [2, 3], use_resource=True, collections=["local"],
            initializer=lambda *a, **k: variable.read_value())
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            np.testing.assert_array_equal(session.run(variable), held)
            session.run(copy.initializer)
            np.testing.assert_array_equal(session.run(copy), held)

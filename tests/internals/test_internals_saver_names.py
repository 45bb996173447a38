"""What towerlib.internals.saver_names relies on: fails loudly if TensorFlow changes it."""

import tensorflow as tf

from towerlib.internals import saver_names


def test_the_saver_names_variables_by_their_op_names():
    with tf.Graph().as_default():
        weights = tf.compat.v1.get_variable("block/weights", [2, 3])
        step = tf.compat.v1.train.get_or_create_global_step()
        names = saver_names.saver_names([weights, step])
        assert sorted(names) == ["block/weights", "global_step"], (
            "saveable_object_util.op_list_to_dict changed: towerlib.internals.saver_names")

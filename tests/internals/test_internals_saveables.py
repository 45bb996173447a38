"""What towerlib.internals.saveables relies on: fails loudly if TensorFlow changes it."""

import numpy as np
import tensorflow as tf

from towerlib.internals import saveables


def test_a_saver_saves_the_tensor_by_its_name_and_restores_through_the_function(tmp_path):
    with tf.Graph().as_default():
        held = tf.compat.v1.Variable(np.zeros([2, 3], np.float32), name="held")
        saved = tf.constant(np.arange(6, dtype=np.float32).reshape(2, 3))
        saveable = saveables.TensorSaveable(
            saved, "w/Adam", lambda value: held.assign(value, read_value=False))
        assert saveable.shape.as_list() == [2, 3] and saveable.dtype == tf.float32
        saver = tf.compat.v1.train.Saver(var_list=[saveable], sharded=True)
        with tf.compat.v1.Session() as session:
            session.run(held.initializer)
            prefix = saver.save(session, str(tmp_path / "ckpt"), write_meta_graph=False)
            assert [name for name, _ in tf.train.list_variables(prefix)] == ["w/Adam"], (
                "saveable_object.SaveableObject changed: towerlib.internals.saveables")
            saver.restore(session, prefix)
            np.testing.assert_array_equal(session.run(held), np.arange(6).reshape(2, 3))

"""The chief's broadcast sets every copy to tower 0's values, for every dtype, exactly."""

import time

import numpy as np
import pytest
import tensorflow as tf

import towerlib
from towerlib.exchange import CrossTowerReducer
from towerlib.update.broadcast import broadcast_from_chief


@pytest.mark.slow  # a collective group forms in-process: ~20 s on 2 shared cores
def test_every_copy_takes_tower_0s_bits():
    devices = ["/device:CPU:0", "/device:CPU:1"]
    with tf.Graph().as_default():
        values = {"weights": np.array([[-0.0, 1e-38], [3.5, -7.25]], np.float32),
                  "step": np.int64(2**40 + 3), "flag": True, "count": np.int32(-5),
                  "half": np.array([1.5, -2.0], np.float16)}
        originals, copies = [], {}
        for name, value in values.items():
            with tf.device(devices[0]):
                original = tf.compat.v1.get_variable(name, initializer=value)
            with tf.device(devices[1]):
                other = tf.compat.v1.get_variable(
                    f"replicated/tower_1/{name}",
                    initializer=tf.zeros_like(tf.constant(value)))
            originals.append(original)
            copies[original.op.name] = [original, other]
        reducer = CrossTowerReducer(devices, transport="collective")
        broadcast = broadcast_from_chief(reducer, originals, copies)
        reducer.check_consistent()
        with tf.compat.v1.Session(config=towerlib.session_config(2)) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(broadcast)
            for original, other in copies.values():
                mine, theirs = session.run([original, other])
                # Equal values (x + 0 is x; -0.0 + 0.0 is +0.0, equal too) and dtypes.
                np.testing.assert_array_equal(theirs, mine, err_msg=original.name)
                assert np.asarray(theirs).dtype == np.asarray(mine).dtype
            assert session.run(copies["step"][1]) == 2**40 + 3  # int64, exact
            assert bool(session.run(copies["flag"][1])) is True


def test_initialize_in_a_users_own_session_is_bounded_when_a_worker_is_absent():
    """Issue 34, item 2: the broadcast waits for every worker of the group; one that
    never starts costs timeout_secs and a TimeoutError naming the fix, not a hang."""
    with tf.Graph().as_default():
        def tower(x, ctx):
            w = tf.compat.v1.get_variable("w", [2], initializer=tf.zeros_initializer())
            return tf.reduce_mean(x * w)
        train = towerlib.build_train_graph(
            tower, tf.ones([4, 2]), tf.compat.v1.train.GradientDescentOptimizer(0.1),
            num_towers=2, update=towerlib.Replicated(), workers=towerlib.WorkerGroup(2, 0))
        with tf.compat.v1.Session(config=towerlib.session_config(2)) as session:
            started = time.monotonic()
            with pytest.raises(TimeoutError, match=r"did not complete within 2 s: a worker "
                               r"of the group has not started.*Fix: start every worker"):
                train.initialize(session, timeout_secs=2)
            assert time.monotonic() - started < 30

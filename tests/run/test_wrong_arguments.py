"""Arguments of the wrong type are one line naming the fix, before TensorFlow reads them.

Each of these failed deep (a bare AttributeError, TypeError or
ZeroDivisionError, or TensorFlow's device error 19 frames down).
"""

import signal

import numpy as np
import pytest
import tensorflow as tf

import towerlib


def tower(x, ctx):
    w = tf.compat.v1.get_variable("w", [2], initializer=tf.zeros_initializer())
    return tf.reduce_mean(x * w)


def train_graph():
    return towerlib.build_train_graph(tower, tf.ones([4, 2]),
                                      tf.compat.v1.train.GradientDescentOptimizer(0.1),
                                      num_towers=2)


@pytest.mark.parametrize("option, value, message", [
    ("session_config", {"a": 1}, "session_config: is a dict. Fix: pass towerlib.session_config"),
    ("hooks", [3], "hooks: must be a list of tf.compat.v1.train.SessionRunHook, got [3]"),
    ("stop_on_signals", "SIGTERM", "stop_on_signals: must be a tuple of signal numbers"),
    ("stop_on_signals", [signal.SIGKILL],
     "stop_on_signals: holds SIGKILL, which no process can catch"),
    ("stop_on_signals", (signal.SIGTERM, signal.SIGSTOP, 999), "stop_on_signals: holds "
     "SIGSTOP, 999, which no process can catch"),
    ("collective_timeout_secs", 0, "collective_timeout_secs: is 0; a step waiting"),
])
def test_run_training_arguments_of_the_wrong_type(tmp_path, option, value, message):
    with tf.Graph().as_default():
        train = train_graph()
        with pytest.raises(towerlib.ConfigError) as raised:
            towerlib.run_training(train, train_dir=str(tmp_path), max_steps=1,
                                  **{option: value})
    assert str(raised.value).startswith(message)
    assert list(tmp_path.iterdir()) == []   # nothing written


def test_cpu_towers_without_a_session_config_get_their_devices(tmp_path):
    """run_training(session_config=None) on '/device:CPU:1' towers failed in TensorFlow's
    placer ('Cannot assign a device for operation tower_1/...')."""
    with tf.Graph().as_default():
        result = towerlib.run_training(train_graph(), train_dir=str(tmp_path), max_steps=2,
                                       save_summaries_steps=None)
    assert result.global_step == 2


def test_library_functions_name_a_wrong_argument():
    with tf.Graph().as_default():
        with pytest.raises(TypeError, match=r"takes a tf.data.Dataset, got list"):
            towerlib.saved_position_iterator([1, 2, 3])
        with pytest.raises(ValueError, match=r"num_towers=0: give the number of towers"):
            towerlib.split_global_batch(tf.ones([4, 2]), 0)
        shards, _ = towerlib.split_global_batch(tf.ones([4, 2]), np.int64(2))  # NumPy int
        assert len(shards) == 2
        with pytest.raises(TypeError, match=r"its second argument is the tower's context"):
            towerlib.batch_norm(tf.ones([4, 2]), None, name="bn")


def test_a_graph_built_for_several_workers_is_refused_in_a_local_session(tmp_path):
    """It waited the collective timeout (300 s), then listed partial
    fetches instead of saying that no other worker can be reached."""
    with tf.Graph().as_default():
        train = towerlib.build_train_graph(
            tower, tf.ones([4, 2]), tf.compat.v1.train.GradientDescentOptimizer(0.1),
            num_towers=2, update=towerlib.Replicated(), workers=towerlib.WorkerGroup(2, 0))
        with pytest.raises(towerlib.ConfigError, match=r"master: is '' .* all-reduces "
                           r"across workers .*run_distributed_training"):
            towerlib.run_training(train, train_dir=str(tmp_path), max_steps=1)


def test_validate_config_names_a_session_config_that_is_no_configproto():
    """The rule lives in validate_config, so a script's up-front check says it too."""
    with pytest.raises(towerlib.ConfigError, match=r"^session_config: is a dict\. Fix: "):
        towerlib.validate_config(session_config={"a": 1}, num_towers=2)

"""The chief's broadcast sets every copy to tower 0's values, for every dtype, exactly."""

import os
import re
import subprocess
import sys
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


def test_the_buffers_go_one_after_another_and_each_is_exact():
    """Float32 variables of 40, 30 and 20 KB with 64 KB buffers, and an int32 one among
    them: three exchanges in one chain ([40], [30, 20], then the int32 as int64). Each
    buffer's reads (the chief's) and zeros (every other member's) wait for the previous
    buffer's assigns, so the start holds one buffer at a time beside the variables; every
    copy still takes tower 0's bits."""
    devices = ["/device:CPU:0", "/device:CPU:1"]
    values = {"a": np.random.RandomState(1).randn(40 * 256).astype(np.float32),
              "n": np.arange(-3, 5, dtype=np.int32),
              "b": np.random.RandomState(2).randn(30 * 256).astype(np.float32),
              "c": np.random.RandomState(3).randn(20 * 256).astype(np.float32)}
    with tf.Graph().as_default():
        originals, copies = [], {}
        for name, value in values.items():
            with tf.device(devices[0]):
                original = tf.compat.v1.get_variable(name, initializer=value)
            with tf.device(devices[1]):
                other = tf.compat.v1.get_variable(f"replicated/tower_1/{name}",
                                                  initializer=np.zeros_like(value))
            originals.append(original)
            copies[name] = [original, other]
        reducer = CrossTowerReducer(devices, transport="graph")
        broadcast = broadcast_from_chief(reducer, originals, copies, chunk_bytes=64 << 10)
        graph = tf.compat.v1.get_default_graph()
        ops = [op for op in graph.get_operations()
               if op.name.startswith("broadcast_from_chief")]

        def assigns_of(*names):
            return {op for op in ops if op.type == "AssignVariableOp"
                    and op.inputs[0].op.name.split("/")[-1] in names}

        def reads_of(name):
            return [op for op in ops if op.type == "ReadVariableOp"
                    and op.inputs[0].op.name == name]

        def zeros_of(name):   # tower 1's contribution, shaped like the variable
            return [op for op in ops if op.type == "Fill" and op.device.endswith("CPU:1")
                    and op.outputs[0].shape == values[name].shape]

        def waits_for(op):   # its control inputs, or its inputs' (a Fill's constants)
            return set(op.control_inputs).union(
                *(tensor.op.control_inputs for tensor in op.inputs))

        assert len(assigns_of("a")) == 2
        for later in ("b", "c"):
            waiting = reads_of(later) + zeros_of(later)
            assert len(waiting) == 2, waiting
            assert all(assigns_of("a") <= waits_for(op) for op in waiting)
        assert not waits_for(reads_of("a")[0])   # the first buffer waits for nothing
        assert not waits_for(zeros_of("a")[0])
        assert not waits_for(reads_of("c")[0]) & assigns_of("b")   # the same buffer
        # The next dtype's buffer waits for the last float32 one.
        assert assigns_of("b", "c") <= waits_for(reads_of("n")[0])
        with tf.compat.v1.Session(config=towerlib.session_config(2)) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(broadcast)
            for original, other in copies.values():
                mine, theirs = session.run([original, other])
                np.testing.assert_array_equal(theirs, mine)
                assert theirs.dtype == mine.dtype


def _tower(x, ctx):
    w = tf.compat.v1.get_variable("w", [2], initializer=tf.zeros_initializer())
    return tf.reduce_mean(x * w)


def test_initialize_in_a_session_of_this_process_alone_names_the_absent_workers():
    """A Session with no server target can never reach worker 1: the broadcast would
    wait the whole timeout (600 s by default) for nothing; it is refused at once."""
    with tf.Graph().as_default():
        train = towerlib.build_train_graph(
            _tower, tf.ones([4, 2]), tf.compat.v1.train.GradientDescentOptimizer(0.1),
            num_towers=2, update=towerlib.Replicated(), workers=towerlib.WorkerGroup(2, 0))
        with tf.compat.v1.Session(config=towerlib.session_config(2)) as session:
            started = time.monotonic()
            with pytest.raises(ValueError, match=r"built for several workers .* the other "
                               r"workers are not there.*Fix: start every worker's process.*"
                               r"run_distributed_training"):
                train.initialize(session, timeout_secs=20)
            assert time.monotonic() - started < 5


LONELY_CHIEF = """
import sys, time
import tensorflow as tf
import towerlib
tf.compat.v1.disable_eager_execution()
ports = sys.argv[1:3]
cluster = tf.train.ClusterSpec({"worker": ["127.0.0.1:" + p for p in ports]})
server = tf.distribute.Server(cluster, job_name="worker", task_index=0,
                              config=towerlib.session_config(2))
def tower(x, ctx):
    w = tf.compat.v1.get_variable("w", [2], initializer=tf.zeros_initializer())
    return tf.reduce_mean(x * w)
with tf.compat.v1.device("/job:worker/task:0"):
    train = towerlib.build_train_graph(
        tower, tf.ones([4, 2]), tf.compat.v1.train.GradientDescentOptimizer(0.1),
        devices=["/job:worker/task:0/device:CPU:0", "/job:worker/task:0/device:CPU:1"],
        update=towerlib.Replicated(), workers=towerlib.WorkerGroup(2, 0))
config = towerlib.session_config(2)
config.device_filters.append("/job:worker/task:0")  # the session starts without worker 1
with tf.compat.v1.Session(server.target, config=config) as session:
    started = time.monotonic()
    try:
        train.initialize(session, timeout_secs=2)
    except TimeoutError as error:
        print("TIMEOUT", round(time.monotonic() - started), error, flush=True)
"""


@pytest.mark.slow  # a fresh Python with its own in-process server (~15 s)
def test_initialize_with_a_server_is_bounded_when_a_worker_is_absent(tmp_path):
    """The chief's server is up, worker 1 never starts: timeout_secs, then TimeoutError."""
    from tests.distributed_processes import free_ports
    script = tmp_path / "lonely_chief.py"
    script.write_text(LONELY_CHIEF)
    result = subprocess.run(
        [sys.executable, str(script)] + [str(p) for p in free_ports(2)],
        capture_output=True, text=True, timeout=240, cwd=os.getcwd(),
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert re.search(r"TIMEOUT \d+ initialize: the chief's broadcast to every worker did not "
                     r"complete within 2 s.*Fix: start every worker", result.stdout), (
        result.stdout + result.stderr[-3000:])
    assert int(result.stdout.split()[1]) < 60

"""Exit statuses by meaning: what a scheduler reads to decide whether to restart."""

import io
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import tensorflow as tf

from tests import helpers
from tests.distributed_processes import free_ports
from towerlib import cluster as cluster_lib
from towerlib.cluster import exits
from towerlib.run import stopping, trainer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tests", "cluster", "own_script.py")


@pytest.mark.parametrize("error, status", [
    (cluster_lib.WorkerLostError("worker task 1 no longer accepts connections"), 138),
    (cluster_lib.ReplicaLostError("a step waited 60 s"), 138),
    (cluster_lib.PsUnavailableError({0: "127.0.0.1:2222"}, 60, 1), 138),
    (cluster_lib.PeerTimeoutError("worker task 1 did not start within 4 s"), 138),
    # A user's own timeout is no lost peer: it keeps Python's status (and traceback).
    (TimeoutError("my download timed out"), 1),
    (socket.timeout("timed out"), 1),
    (ConnectionRefusedError("my database is down"), 1),
    (ValueError("--num_towers=0: give 1 or more"), 2),
    (TypeError("task index must be an int"), 2),
    # One from the user's own code too: the type cannot tell who raised it (docs' table).
    (TypeError("unsupported operand type(s) for +: 'int' and 'str'"), 2),
    (cluster_lib.AddressError("127.0.0.1:2222 is in use"), 2),
    (KeyboardInterrupt(), 130),
    (stopping.StopSignalReceived(signal.SIGTERM), 143),
    (RuntimeError("a bug"), 1),
    (tf.errors.ResourceExhaustedError(None, None, "out of memory"), 1),
])
def test_exit_status_by_meaning(error, status):
    assert exits.exit_status(error) == status


def run_main(main, monkeypatch, debug=False):
    """(status, stderr text) of exit_by_meaning(main) in this process."""
    monkeypatch.setenv(exits.DEBUG_VARIABLE, "1" if debug else "0")
    stderr = io.StringIO()
    with pytest.raises(SystemExit) as exited:
        exits.exit_by_meaning(main, task="worker 1", stderr=stderr)
    return exited.value.code, stderr.getvalue()


def test_a_lost_peer_is_one_line_with_the_traceback_in_a_file(monkeypatch, tmp_path):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))

    def main():
        raise cluster_lib.WorkerLostError("Worker 1: worker task 0 no longer accepts "
                                          "connections. Fix: restart every worker.")
    status, text = run_main(main, monkeypatch)
    assert status == 138
    assert text.count("\n") == 1 and text.startswith(
        "error: worker 1: WorkerLostError: Worker 1: worker task 0 no longer accepts "
        "connections. Fix: restart every worker. [exit 138, retryable; traceback: ")
    log = text.rstrip().rstrip("]").rsplit("traceback: ", 1)[1]
    assert os.path.dirname(log) == str(tmp_path)
    assert "Traceback" in open(log).read() and "in main" in open(log).read()


def test_debug_shows_the_traceback_before_the_line(monkeypatch):
    def main():
        raise ValueError("--model=vgg16: unknown")
    status, text = run_main(main, monkeypatch, debug=True)
    assert status == 2
    assert text.startswith("Traceback") and text.splitlines()[-1] == (
        "error: worker 1: ValueError: --model=vgg16: unknown [exit 2, fix and rerun]")


def test_a_users_own_timeout_keeps_its_meaning(monkeypatch):
    """Not 138: a scheduler would restart, forever, a job that lost no peer."""
    def main():
        raise TimeoutError("my own download timed out")
    with pytest.raises(TimeoutError, match="my own download"):
        exits.exit_by_meaning(main, stderr=io.StringIO())


def test_towerlibs_own_waits_on_other_tasks_are_retryable(monkeypatch):
    """The waits towerlib bounds (the ps tasks' answer, here) raise its own class."""
    from towerlib.cluster import runtime
    cluster = cluster_lib.cluster_from_flags(
        ps_hosts=f"127.0.0.1:{free_ports(1)[0]}", worker_hosts="127.0.0.1:1",
        job_name="worker", task_index=0)
    with pytest.raises(cluster_lib.PeerTimeoutError) as raised:
        runtime.wait_for_ps_tasks(cluster, timeout_secs=0.3, poll_secs=0.1)
    assert isinstance(raised.value, TimeoutError)
    assert exits.exit_status(raised.value) == exits.RETRYABLE


def test_a_bug_keeps_pythons_traceback_and_status(monkeypatch):
    def main():
        raise RuntimeError("a bug")
    with pytest.raises(RuntimeError, match="a bug"):
        exits.exit_by_meaning(main, stderr=io.StringIO())


def test_returning_is_0_and_a_signal_stop_is_128_plus_the_signal(monkeypatch):
    assert run_main(lambda: None, monkeypatch) == (0, "")
    stopped = trainer.TrainingResult(7, 0.5)
    stopped.stop_signal, stopped.checkpoint = "SIGTERM", "/runs/a/model.ckpt-7"
    status, text = run_main(lambda: stopped, monkeypatch)
    assert status == 143 and text == (
        "worker 1: stopped by SIGTERM at step 7 (checkpoint /runs/a/model.ckpt-7) "
        "[exit 143]\n")


def own_script(args, env=None, timeout=120):
    environ = dict(os.environ, PYTHONPATH=helpers.python_path(ROOT), TF_CPP_MIN_LOG_LEVEL="3",
                   CUDA_VISIBLE_DEVICES="", **(env or {}))
    environ.pop("TF_CONFIG", None) if "TF_CONFIG" not in (env or {}) else None
    return subprocess.Popen([sys.executable, SCRIPT, *map(str, args)], env=environ,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def error_lines(stderr):
    return [line for line in stderr.splitlines() if line.startswith("error: ")]


@pytest.mark.slow  # fresh TensorFlow processes
def test_a_users_own_script_exits_by_meaning(tmp_path):
    """A never-started peer: 138; a wrong TF_CONFIG: 2; SIGTERM mid-run: 143."""
    ports = free_ports(2)
    tf_config = {"cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
                 "task": {"type": "worker", "index": 0}}
    lonely = own_script([tmp_path / "a", 5, 3], {"TF_CONFIG": json.dumps(tf_config)})
    wrong = own_script([tmp_path / "b", 5], {"TF_CONFIG": '{"cluster": {"worker": '
                                             '["127.0.0.1:1"]}, "task": {"type": "wroker"}}'})
    signalled = own_script([tmp_path / "c", 10000])
    try:
        _, stderr = lonely.communicate(timeout=120)
        assert lonely.returncode == 138, stderr[-3000:]
        (line,) = error_lines(stderr)
        assert "WorkerLostError" in line and "worker task 1" in line and "exit 138" in line
        assert "Traceback" not in stderr

        _, stderr = wrong.communicate(timeout=120)
        assert wrong.returncode == 2, stderr[-3000:]
        (line,) = error_lines(stderr)
        assert "TF_CONFIG" in line and "'wroker'" in line and "exit 2" in line

        deadline = time.monotonic() + 90
        while not (tmp_path / "c" / "checkpoint").exists():
            assert time.monotonic() < deadline and signalled.poll() is None
            time.sleep(0.2)
        signalled.send_signal(signal.SIGTERM)
        _, stderr = signalled.communicate(timeout=60)
        assert signalled.returncode == 143, stderr[-3000:]
        assert "trainer: stopped by SIGTERM at step" in stderr
    finally:
        for process in (lonely, wrong, signalled):
            if process.poll() is None:
                process.kill()
                process.wait()


@pytest.mark.parametrize("error, status", [
    (TimeoutError("the download timed out"), None),   # not caught: Python's 1
    (socket.timeout("timed out"), None),
    (cluster_lib.PeerTimeoutError("ps task 0 did not answer"), 138),
])
def test_the_example_scripts_retry_only_towerlibs_own_timeouts(error, status, monkeypatch):
    from examples.cifar10 import script_runner
    monkeypatch.setattr(script_runner, "configure_logging", lambda: None)  # the test's own

    def body():
        raise error
    if status is None:
        with pytest.raises(type(error)):
            script_runner.run(body)
    else:
        with pytest.raises(SystemExit) as exited:
            script_runner.run(body)
        assert exited.value.code == status

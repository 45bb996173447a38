"""The pieces that let a replica survive a lost ps task, in one process, without a cluster.

The whole story with real processes (a ps killed and restarted, a ps gone
for good) is tests/cluster/test_distributed_ps_faults.py.
"""

import socket
import threading
import time

import pytest
import tensorflow as tf

from tests.distributed_processes import free_ports
from towerlib.cluster import recovery
from towerlib.cluster.spec import cluster_from_flags
from towerlib.run import sessions


def replica_of(ps_ports, task_index=1):
    return cluster_from_flags(
        ps_hosts=",".join(f"127.0.0.1:{port}" for port in ps_ports),
        worker_hosts="127.0.0.1:1,127.0.0.1:2", job_name="worker", task_index=task_index)


@pytest.fixture
def listening_port():
    """A port on 127.0.0.1 that accepts connections (a ps that answers)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    yield server.getsockname()[1]
    server.close()


def test_unreachable_ps_tasks_names_only_the_silent_ones(listening_port):
    (closed_port,) = free_ports(1)
    cluster = replica_of([listening_port, closed_port])
    assert recovery.unreachable_ps_tasks(cluster) == {1: f"127.0.0.1:{closed_port}"}


def test_a_ps_that_stays_away_gives_a_clear_error_within_the_bound():
    (closed_port,) = free_ports(1)
    started = time.monotonic()
    with pytest.raises(recovery.PsUnavailableError) as raised:
        recovery.wait_for_ps_to_answer(replica_of([closed_port]), timeout_secs=1.0,
                                       poll_secs=0.2)
    assert time.monotonic() - started < 3.0
    message = str(raised.value)
    assert (f"Replica 1 lost its connection to ps task 0 (ps:0 at 127.0.0.1:{closed_port}) "
            "and it did not come back within 1 s") in message
    assert "restart it with the same command" in message
    assert "--ps_restart_timeout_secs" in message
    assert raised.value.unreachable == {0: f"127.0.0.1:{closed_port}"}


def test_close_within_gives_up_on_a_close_that_never_returns():
    never = threading.Event()
    started = time.monotonic()
    assert not recovery.close_within(never.wait, timeout_secs=0.3)
    assert time.monotonic() - started < 2.0
    never.set()


def test_close_within_reports_a_close_that_failed_as_closed():
    def failing_close():
        raise tf.errors.AbortedError(None, None, "Session handle is not found")

    assert recovery.close_within(failing_close, timeout_secs=5.0)


class FakeSession:
    def __init__(self):
        self.closes = 0

    def close(self):
        self.closes += 1


class FakeCreator:
    def __init__(self):
        self.sessions = []

    def create_session(self):
        self.sessions.append(FakeSession())
        return self.sessions[-1]


class FakeControl:
    def __init__(self):
        self.calls = []

    def renew(self):
        self.calls.append("renew")

    def wait_for_chief(self, timeout_secs):
        self.calls.append("wait_for_chief")


@pytest.mark.parametrize("task_index, expected_calls", [
    (0, ["renew"]), (1, ["renew", "wait_for_chief"])])
def test_recreated_sessions_wait_for_the_ps_and_renew_the_control_session(
        listening_port, task_index, expected_calls):
    inner, control = FakeCreator(), FakeControl()
    creator = recovery.RecoveringSessionCreator(
        inner, replica_of([listening_port], task_index), control, timeout_secs=5.0)
    first = creator.create_session()
    assert control.calls == []  # run_distributed_training waited before the first one
    creator.create_session()
    assert control.calls == expected_calls
    # MonitoredSession's close, then Session.__del__'s: closed once, bounded.
    first.close()
    first.close()
    assert inner.sessions[0].closes == 1


def test_recreated_session_fails_when_the_ps_does_not_come_back():
    (closed_port,) = free_ports(1)
    control = FakeControl()
    creator = recovery.RecoveringSessionCreator(
        FakeCreator(), replica_of([closed_port]), control, timeout_secs=0.5)
    creator.create_session()
    with pytest.raises(recovery.PsUnavailableError, match="ps task 0"):
        creator.create_session()
    assert control.calls == []


def test_chief_session_recreated_restores_the_newest_checkpoint(tmp_path):
    """The first session starts as decided at start; a later one takes what is on disk."""
    with tf.Graph().as_default():
        global_step = tf.compat.v1.train.get_or_create_global_step()
        weight = tf.compat.v1.get_variable("w", initializer=1.0)
        train_a_while = [global_step.assign(7), weight.assign(5.0)]
        scaffold = tf.compat.v1.train.Scaffold()
        creator = sessions.ChiefSessionCreator(scaffold, "", None, str(tmp_path), None)
        with creator.create_session() as session:
            assert session.run([global_step, weight]) == [0, 1.0]
            session.run(train_a_while)
            # Written while the first session runs (the chief's saver hook does this).
            scaffold.saver.save(session, str(tmp_path / "model.ckpt"), global_step=7)
        with creator.create_session() as session:
            assert session.run([global_step, weight]) == [7, 5.0]

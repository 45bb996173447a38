"""A replica that loses its ps task: wait a bounded time for it, then rejoin or fail.

When a ps task dies, every step that touches it fails with UnavailableError
("Connection refused", "Connection reset") and MonitoredSession creates a new
session. Stock, that never ends when the ps does not come back: TensorFlow's
session creation waits for every task in the device filters with no timeout
(no RunOptions or ConfigProto field reaches it). And when the ps does come
back, it has lost its variables and every graph registered on it, so the
replica's other sessions (its ControlSession) fail with "Session handle is
not found".

`RecoveringSessionCreator` wraps run_training's session creator: before
every new session after the first it waits, at most `timeout_secs`, for the
ps tasks to accept connections again (`PsUnavailableError` naming the task
otherwise), opens a fresh control session, and on a non-chief waits for the
chief to restore the variables (polling every 0.5 s, where TensorFlow's
worker session creator polls every 30 s). The chief's own new session
restores the newest complete checkpoint in train_dir (towerlib.run.trainer).
"""

import logging
import socket
import threading
import time

import tensorflow as tf

from towerlib.cluster.spec import PS_JOB

logger = logging.getLogger("towerlib")

# How long a replica waits for a lost ps task to come back, by default.
DEFAULT_PS_RESTART_TIMEOUT_SECS = 300.0
# Closing a session whose ps is gone never returns; it is given this long.
SESSION_CLOSE_TIMEOUT_SECS = 3.0
# How often a task waiting for others says which ones, and the time left.
REPORT_EVERY_SECS = 5.0


class PsUnavailableError(RuntimeError):
    """A ps task stopped answering and did not come back within the bound.

    Attributes:
      unreachable: {ps task index: "host:port"} of the tasks that did not answer.
      timeout_secs: how long this replica waited for them.
    """

    def __init__(self, unreachable, timeout_secs, replica_index):
        self.unreachable = dict(unreachable)
        self.timeout_secs = timeout_secs
        described = ", ".join(f"ps task {index} ({PS_JOB}:{index} at {address})"
                              for index, address in sorted(self.unreachable.items()))
        super().__init__(
            f"Replica {replica_index} lost its connection to {described} and it did "
            f"not come back within {timeout_secs:.0f} s, so training stopped here. "
            "The ps holds the variables: restart it with the same command "
            "(--job_name=ps, same --ps_hosts) and restart this worker; the chief "
            "resumes from the newest checkpoint in train_dir. Raise the bound with "
            "ps_restart_timeout_secs (--ps_restart_timeout_secs).")


def accepts_connections(address, connect_timeout_secs=0.5):
    """Whether 'host:port' accepts a TCP connection now (a stopped process still does)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)),
                                      timeout=connect_timeout_secs):
            return True
    except OSError:
        return False


def unreachable_ps_tasks(cluster, connect_timeout_secs=0.5):
    """{index: address} of the ps tasks that do not accept a TCP connection now."""
    return {index: address for index, address in enumerate(cluster.jobs[PS_JOB])
            if not accepts_connections(address, connect_timeout_secs)}


def wait_for_answers(unreachable, timeout_secs, error, poll_secs=0.5,
                     waiting_for="", report_every_secs=REPORT_EVERY_SECS):
    """Polls `unreachable()` ({task: address}) until it is empty.

    While some task is silent, logs every report_every_secs which ones and the
    time left before the timeout (`waiting_for` names the wait: "the other
    workers to start").

    Raises:
      error(what is still unreachable) once timeout_secs have passed.
    """
    started = time.monotonic()
    deadline = started + timeout_secs
    next_report = started + report_every_secs
    while True:
        silent = unreachable()
        if not silent:
            return
        now = time.monotonic()
        if now > deadline:
            raise error(silent)
        if now >= next_report:
            logger.info("Waiting %.0f s for %s: %s not answering yet; %.0f s left before "
                        "the timeout.", now - started, waiting_for or "the cluster",
                        ", ".join(f"{task} ({address})" for task, address in silent.items()),
                        deadline - now)
            next_report = now + report_every_secs
        time.sleep(poll_secs)


def wait_for_ps_to_answer(cluster, timeout_secs, poll_secs=0.5):
    """Blocks until every ps task accepts connections.

    Returns:
      {} at once when they all answer.

    Raises:
      PsUnavailableError: naming the tasks still silent after timeout_secs.
    """
    wait_for_answers(
        lambda: unreachable_ps_tasks(cluster, max(poll_secs, 0.1)), timeout_secs,
        lambda silent: PsUnavailableError(silent, timeout_secs, cluster.replica_index),
        poll_secs, waiting_for="the ps tasks to come back")
    return {}


def close_within(close_session, timeout_secs=SESSION_CLOSE_TIMEOUT_SECS):
    """Calls `close_session` (a tf.compat.v1.Session's close), giving up after timeout_secs.

    Returns True when the session closed in time.

    Closing a gRPC session deregisters its graphs on every task, and waits
    forever for a ps task that is gone. The close runs in a daemon thread,
    left behind blocked in TensorFlow if it does not return in time.
    """
    failures = []

    def close():
        try:
            close_session()
        except tf.errors.OpError as error:
            failures.append(error)

    closer = threading.Thread(target=close, name="towerlib-close-session", daemon=True)
    closer.start()
    closer.join(timeout_secs)
    if closer.is_alive():
        logger.warning("A session did not close within %.0f s (a ps task is gone?); "
                       "left behind.", timeout_secs)
        return False
    if failures:
        logger.info("Closing a session: %s", failures[0].message.splitlines()[0])
    return True


def _with_bounded_close(session):
    """`session`, whose close() (called by MonitoredSession) cannot hang.

    Only the first call closes: Session.__del__ calls close() again, during
    garbage collection, where starting a thread can deadlock.
    """
    unbounded_close = session.close
    close_calls = []

    def bounded_close():
        if not close_calls:
            close_calls.append(True)
            close_within(unbounded_close)

    session.close = bounded_close
    return session


class RecoveringSessionCreator(tf.compat.v1.train.SessionCreator):
    """Wraps a replica's session creator so that a lost ps task costs a bounded wait.

    The first session is created as it is (run_distributed_training has
    already waited for the ps tasks and, on a non-chief, for the chief).
    Every later one, which MonitoredSession asks for after a step failed
    with UnavailableError or AbortedError, first waits for the ps tasks
    (PsUnavailableError after `timeout_secs`), renews `control` (its session
    lived on the old ps) and, on a non-chief, waits for the chief to have
    restored the variables (TimeoutError after `timeout_secs`). The sessions
    it returns close within SESSION_CLOSE_TIMEOUT_SECS (MonitoredSession
    closes the old session before asking for a new one, and that close
    alone would wait for a dead ps forever).

    Args:
      inner: run_training's SessionCreator.
      cluster: this replica's ClusterInfo.
      control: its runtime.ControlSession.
      timeout_secs: the bound on each of the waits above.
    """

    def __init__(self, inner, cluster, control, timeout_secs):
        self._inner = inner
        self._cluster = cluster
        self._control = control
        self._timeout_secs = timeout_secs
        self.sessions_created = 0

    def create_session(self):
        if self.sessions_created:
            self._wait_until_the_ps_tasks_are_back()
        session = _with_bounded_close(self._inner.create_session())
        self.sessions_created += 1
        return session

    def _wait_until_the_ps_tasks_are_back(self):
        started = time.monotonic()
        unreachable = unreachable_ps_tasks(self._cluster)
        if unreachable:
            logger.warning(
                "Replica %d lost its session; %s not answering: waiting up to %.0f s "
                "for it to restart.", self._cluster.replica_index,
                ", ".join(f"ps task {i} at {a}" for i, a in unreachable.items()),
                self._timeout_secs)
        wait_for_ps_to_answer(self._cluster, self._timeout_secs)
        self._control.renew()
        if not self._cluster.is_chief:
            remaining = self._timeout_secs - (time.monotonic() - started)
            self._control.wait_for_chief(max(remaining, 1.0))
        logger.info("Replica %d: the ps tasks answer again; rejoining training.",
                    self._cluster.replica_index)

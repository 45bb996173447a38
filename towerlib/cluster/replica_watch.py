"""A synchronous step that waits for a lost replica: logged, bounded, then one clear error.

Under SyncReplicasOptimizer the chief's step waits until every replica has
sent its gradients, and every replica waits for the chief's token: a worker
killed (or stopped) for good leaves the others waiting in session.run,
forever and silently. Each replica's step therefore

- says every `log_every_secs` that it is still waiting, and for how long;
- carries a deadline (RunOptions.timeout_in_ms): past it the step fails, and
  run_distributed_training raises ReplicaLostError naming the workers that
  do not accept connections (or, when all do, that one is stopped or too
  slow), tells the ps tasks to stop, and this process ends.

    hooks = [StepDeadlineHook(deadline_secs=300)]   # run_distributed_training adds it

The deadline must exceed the slowest normal step, the first one included
(it builds and warms up): 300 s by default.
"""

import logging
import threading
import time

import tensorflow as tf

from towerlib.cluster import recovery
from towerlib.cluster.spec import CHIEF_JOB, WORKER_JOB

__all__ = ["DEFAULT_STEP_DEADLINE_SECS", "ReplicaLostError", "StepDeadlineHook",
           "lost_replica_error", "unreachable_workers"]

logger = logging.getLogger("towerlib")

DEFAULT_STEP_DEADLINE_SECS = 300.0


class ReplicaLostError(RuntimeError):
    """A synchronous step did not complete within its deadline: a replica is missing."""


def unreachable_workers(cluster, connect_timeout_secs=0.5):
    """{'job task i': address} of the other training tasks that refuse a TCP connection."""
    unreachable = {}
    for job in (CHIEF_JOB, WORKER_JOB):
        for index, address in enumerate(cluster.jobs.get(job, [])):
            if job == cluster.job_name and index == cluster.task_index:
                continue
            if not recovery.accepts_connections(address, connect_timeout_secs):
                unreachable[f"{job} task {index}"] = address
    return unreachable


def lost_replica_error(cluster, deadline_secs, run):
    """The ReplicaLostError for a step past its deadline, naming what can be named."""
    gone = unreachable_workers(cluster)
    if gone:
        who = ", ".join(f"{task} ({address})" for task, address in gone.items())
        what = f"{who} no longer accept{'s' if len(gone) == 1 else ''} connections"
    else:
        what = ("every worker accepts connections, so one is stopped (SIGSTOP), hung "
                "or slower than the deadline")
    return ReplicaLostError(
        f"Replica {cluster.replica_index}: its run {run} did not complete within "
        f"{deadline_secs:.0f} s: {what}. Fix: restart the missing worker with the same "
        "command (the chief resumes from the newest checkpoint), or restart the whole "
        "job; raise the bound with step_deadline_secs if steps are this slow.")


class StepDeadlineHook(tf.compat.v1.train.SessionRunHook):
    """Bounds each run with a deadline and logs while a run waits.

    One watcher thread for the whole loop (started with the first run, not one
    per step) sleeps until the run in progress has lasted `log_every_secs`,
    then logs a line every `log_every_secs` while it goes on. Runs shorter than
    that cost it no wake-up each: it looks again once the one it waited on is due.

    Args:
      deadline_secs: RunOptions.timeout_in_ms of every run, in seconds.
      log_every_secs: while a run lasts longer, a line every this many seconds.
    """

    def __init__(self, deadline_secs=DEFAULT_STEP_DEADLINE_SECS, log_every_secs=5.0):
        if not deadline_secs > 0:
            raise ValueError(f"step deadline must be > 0 seconds, got {deadline_secs!r}.")
        self.deadline_secs = float(deadline_secs)
        self._log_every_secs = log_every_secs
        self._changed = threading.Condition()
        self._current = None  # (run number, its start) while a run is in progress
        self._ended = threading.Event()
        self._watcher = None
        self.runs = 0

    def before_run(self, run_context):
        self.runs += 1
        with self._changed:
            self._current = (self.runs, time.monotonic())
            self._changed.notify()
        if self._watcher is None:
            self._watcher = threading.Thread(target=self._watch, daemon=True,
                                             name="towerlib-step-watch")
            self._watcher.start()
        return tf.compat.v1.train.SessionRunArgs(None, options=tf.compat.v1.RunOptions(
            timeout_in_ms=int(self.deadline_secs * 1000)))

    def after_run(self, run_context, run_values):
        with self._changed:
            self._current = None

    def end(self, session):
        self._ended.set()
        with self._changed:
            self._changed.notify()

    def _next_run(self):
        """(run, start) of the run in progress, waiting for one; None once ended."""
        with self._changed:
            while self._current is None and not self._ended.is_set():
                self._changed.wait()
            return None if self._ended.is_set() else self._current

    def _watch(self):
        while True:
            current = self._next_run()
            if current is None:
                return
            run, started = current
            due = started + self._log_every_secs
            while not self._ended.wait(max(0.0, due - time.monotonic())):
                with self._changed:  # said under the lock: none once after_run returns
                    if self._current is None or self._current[0] != run:
                        break  # that run is over: watch the one in progress now
                    logger.info("run %d of this replica: waiting %.0f s for the other "
                                "replicas (deadline %.0f s)", run,
                                time.monotonic() - started, self.deadline_secs)
                due += self._log_every_secs

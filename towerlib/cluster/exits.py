"""Exit statuses by meaning, so that a scheduler knows whether to restart.

    status  meaning                                   a scheduler should
    0       training ended
    2       a user's mistake (a wrong flag, option,   not restart: it fails the same way
            address or environment); any ValueError
            or TypeError, the user's own code's too
    138     a peer, a ps task or a deadline was lost  restart every task; they resume from
            (RETRYABLE)                               the newest checkpoint
    128+s   stopped by signal s (130 SIGINT,          what it does for a stop it sent
            143 SIGTERM)
    69      its host is gone (HOST_LOST): a task's    towerlib-launch --workers MIN:MAX:
            own word, never towerlib's                restart on the workers that remain

138 is what Kubeflow's training operator reserves for a user-defined retryable
error (`restartPolicy: ExitCode` restarts 130, 137, 138 and 143 and treats 1, 2,
126, 127, 128 and 139 as permanent); towerlib.launch and Ray restart it too.
Only towerlib's own errors for a lost peer and for a wait on another task that
passed its bound (WorkerLostError, ReplicaLostError, PsUnavailableError,
PeerTimeoutError) are 138: a user's own TimeoutError or socket.timeout keeps
its meaning. A ValueError or TypeError is 2 wherever it was raised: towerlib
raises them for a wrong option, and one from the user's own code cannot be told
apart by type; either fails the same way on a rerun. Anything else (another
bug, an out-of-memory error, a user's timeout) keeps Python's status 1 and its
traceback.

This module imports no TensorFlow until a task fails (towerlib-launch reads its
statuses and must start its first task at once).

`exit_by_meaning` maps what a task raised to its status and one line on stderr:

    >>> def main():
    ...     cluster_lib.run_distributed_training(sync_graph, server, ...)
    >>> cluster_lib.exit_by_meaning(main, task="worker 1")   # never returns

The one line names the task, the error, the fix and the status; the traceback
(with TensorFlow's gRPC detail) goes to a new file in the temporary folder whose
name ends the line, or to stderr, before the line, when TOWERLIB_DEBUG=1.
"""

import logging
import os
import signal
import sys
import tempfile
import traceback

logger = logging.getLogger("towerlib")

USER_ERROR = 2
RETRYABLE = 138
# A task's word that its host is gone (sysexits' EX_UNAVAILABLE): restarting it there
# cannot help; an elastic towerlib-launch job goes on without it.
HOST_LOST = 69
# Statuses towerlib.launch restarts a job on: the retryable error and a task killed
# from outside (SIGKILL by the OOM killer or a person; SIGTERM by a preempting host).
RESTART_STATUSES = frozenset({RETRYABLE, 128 + signal.SIGKILL, 128 + signal.SIGTERM})
DEBUG_VARIABLE = "TOWERLIB_DEBUG"



def _retryable_errors():
    """What towerlib raises when another task is gone or did not answer within its
    bound: restarting every task fixes it. towerlib's classes only: a TimeoutError
    of the user's own is not a lost peer."""
    from towerlib.cluster import recovery, replica_watch
    from towerlib.exchange.safety import PeerTimeoutError
    return (replica_watch.ReplicaLostError, recovery.PsUnavailableError, PeerTimeoutError)


def _user_errors():
    """A user's mistake: the same command fails the same way again."""
    from towerlib.cluster import placement
    from towerlib.run import checkpoint_state
    return (ValueError, TypeError, placement.AddressError, checkpoint_state.CheckpointError)


def for_signal(signum):
    """The status of a task stopped by signal `signum`: 128 + signum, as a shell's."""
    return 128 + int(signum)


def exit_status(error):
    """The status a task that raised `error` exits with (see the module's table).

    >>> exit_status(towerlib.cluster.WorkerLostError("worker 1 ..."))
    138
    >>> exit_status(ValueError("--num_towers=0: ..."))
    2
    >>> exit_status(TimeoutError("my own download timed out"))   # not towerlib's
    1
    """
    from towerlib.run import stopping
    if isinstance(error, SystemExit):
        return error.code if isinstance(error.code, int) else (error.code is not None)
    if isinstance(error, stopping.StopSignalReceived):
        return for_signal(error.signum)
    if isinstance(error, KeyboardInterrupt):
        return for_signal(signal.SIGINT)
    if isinstance(error, _retryable_errors()):
        return RETRYABLE
    if isinstance(error, _user_errors()):
        return USER_ERROR
    return 1


def _write_traceback(error, task):
    """Writes `error`'s traceback to a new file of towerlib's; returns its path."""
    prefix = "towerlib-" + "".join(c if c.isalnum() else "-" for c in task) + "-"
    handle, path = tempfile.mkstemp(prefix=prefix, suffix=".log")
    with os.fdopen(handle, "w") as log:
        traceback.print_exception(type(error), error, error.__traceback__, file=log)
    return path


def failure_line(error, task, status, detail=""):
    """The one stderr line for a task ending on `error` with `status`."""
    kind = {RETRYABLE: "retryable", USER_ERROR: "fix and rerun"}.get(
        status, "stopped" if status > 128 else "failed")
    first = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return (f"error: {task}: {type(error).__name__}: {first} "
            f"[exit {status}, {kind}{'; ' + detail if detail else ''}]")


def exit_by_meaning(main, task="this task", stderr=None):
    """Runs main(); exits with the status of how it ended (see the module's table).

    main returning is status 0, unless it returns run_training's result with a
    stop_signal (a SIGTERM stopped training cleanly): then 128 + that signal,
    so a scheduler that sent it sees a stop, not a finished job. main raising
    is exit_status(error).

    One line on stderr (failure_line, ending with where the traceback went) for the
    statuses of the module's table; any other error is raised on unchanged
    (Python's status 1 and traceback: it is a bug to report, not a fault).

    Args:
      main: a function of no arguments, the task's whole work.
      task: how the line names this task ("worker 1", "ps 0"), or a function
        returning it when main failed (the task may be known only once main
        has read the cluster).
      stderr: where the line goes (default sys.stderr).
    """
    stderr = stderr or sys.stderr
    from towerlib.run import stopping
    try:
        result = main()
    except (Exception, KeyboardInterrupt, stopping.StopSignalReceived) as error:
        status = exit_status(error)
        if status == 1:
            raise
        task = task() if callable(task) else task
        if os.environ.get(DEBUG_VARIABLE) == "1":
            traceback.print_exception(type(error), error, error.__traceback__, file=stderr)
            stderr.write(failure_line(error, task, status) + "\n")
        else:
            try:
                detail = f"traceback: {_write_traceback(error, task)}"
            except OSError:  # a full or read-only temporary folder: the status still counts
                traceback.print_exception(type(error), error, error.__traceback__,
                                          file=stderr)
                detail = ""
            stderr.write(failure_line(error, task, status, detail) + "\n")
        stderr.flush()
        sys.exit(status)
    stop_signal = getattr(result, "stop_signal", None)   # run_training's TrainingResult
    if stop_signal:
        task = task() if callable(task) else task
        status = for_signal(signal.Signals[stop_signal])
        stderr.write(f"{task}: stopped by {stop_signal} at step {result.global_step} "
                     f"(checkpoint {result.checkpoint}) [exit {status}]\n")
        stderr.flush()
        sys.exit(status)
    sys.exit(0)

"""What a task's exit status means to the launcher: done, restart the job, or end it.

The statuses are towerlib.cluster.exits's (one source of truth): 0 done;
RESTART_STATUSES (138 a lost peer, 137 SIGKILL, 143 SIGTERM) restart every
task; anything else (2 a user's mistake, 1 a bug) ends the job with it.
HOST_LOST (69, EX_UNAVAILABLE in sysexits.h) is never towerlib's own: a task
exits with it to say that its host is gone, so that restarting it there cannot
help. A fixed-size job ends with it; an elastic one (--workers MIN:MAX)
restarts on the workers that remain.
Popen reports a task killed by signal s as -s; a shell, a scheduler and the
launcher's own exit status say 128 + s, so the launcher does too.
"""

import signal

from towerlib.cluster.exits import HOST_LOST, RESTART_STATUSES, RETRYABLE, USER_ERROR

__all__ = ["HOST_LOST", "RESTART_STATUSES", "describe_status", "is_address_error", "is_restartable",
           "shell_status"]


def shell_status(returncode):
    """Popen's returncode as a shell's status: -9 -> 137, -15 -> 143, 2 -> 2."""
    return 128 - returncode if returncode < 0 else returncode


def _signal_name(signum):
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def describe_status(status):
    """A few words on what `status` says: 'killed by SIGKILL', 'a lost peer', ..."""
    if status == 0:
        return "done"
    if status == RETRYABLE:
        return "a lost peer, retryable"
    if status == USER_ERROR:
        return "a user's mistake"
    if status == HOST_LOST:
        return "its host is lost"
    if 128 < status < 128 + 65:
        return f"killed by {_signal_name(status - 128)}"
    return "failed"


def is_restartable(status):
    """Whether restarting every task can fix what ended a task with `status`."""
    return status in RESTART_STATUSES


def is_address_error(status, last_line):
    """A task whose server could not listen on its port (exit_by_meaning's line for
    towerlib.cluster.AddressError): new ports fix it, unlike other mistakes."""
    return status == USER_ERROR and "AddressError" in (last_line or "")

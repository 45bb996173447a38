"""The task processes: started in their own sessions, signalled and always stopped.

Each task runs in a new session (its own process group, away from the
terminal's), so a signal to the group reaches whatever the task started too,
and Ctrl-C reaches the launcher alone, which forwards it. Each task also gets
PR_SET_PDEATHSIG = SIGKILL, and the launcher's reaper.Watchdog kills the rest
of its session: if the launcher itself is SIGKILLed (the one path it cannot
act on), nothing the task started survives it. `stop_children` is the one way
an attempt ends: the signal, a bounded grace, then SIGKILL to every process of
every task's session, exited tasks' included (a task's own children may
outlive it).

A stopped task (SIGSTOP, SIGTSTP) cannot act on SIGTERM until it runs again,
so every stop signal is followed by SIGCONT: a stopped task then stops as the
others do, saving first, within the same grace, instead of waiting out the
grace and being SIGKILLed.
"""

import ctypes
import dataclasses
import os
import signal
import subprocess
import time

from towerlib.launch import reaper, statuses

__all__ = ["Child", "signal_child", "start_child", "stop_children"]

_PR_SET_PDEATHSIG = 1
try:   # loaded now: in the forked child, before exec, only the syscall runs
    _LIBC = ctypes.CDLL(None, use_errno=True)
except OSError:
    _LIBC = None

READER_JOIN_SECS = 5.0   # a task's output after it ends, unless its children hold the pipe


def _die_with_launcher():
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))


@dataclasses.dataclass
class Child:
    """A started task: its Popen, its output's reader threads, when it started."""

    task: object
    process: subprocess.Popen
    readers: list
    started_at: float

    @property
    def pid(self):
        return self.process.pid

    def status(self):
        """None while it runs, else its exit status as a shell's (launch.statuses)."""
        code = self.process.poll()
        return None if code is None else statuses.shell_status(code)

    def join_readers(self, timeout_secs=READER_JOIN_SECS):
        """Waits (bounded) until its output is copied, so that its last line is known."""
        deadline = time.monotonic() + timeout_secs
        for reader in self.readers:
            reader.join(max(deadline - time.monotonic(), 0.0))


def start_child(task, command, env, output):
    """Starts `command` as `task` with environment `env`, its output through `output`.

    Raises:
      OSError: the command cannot be run (not found, not executable).
    """
    with reaper.spawning() as record:
        process = record(subprocess.Popen(
            command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, start_new_session=True, preexec_fn=_die_with_launcher))
    readers = [output.follow(task, process.stdout),
               output.follow(task, process.stderr, to_stderr=True)]
    return Child(task, process, readers, time.monotonic())


def signal_child(child, signum):
    """Sends `signum` to `child`'s whole process group, then SIGCONT unless it is
    SIGKILL (a stopped task acts on it at once); a group already gone is fine."""
    for sent in (signum,) if signum == signal.SIGKILL else (signum, signal.SIGCONT):
        try:
            os.killpg(child.pid, sent)
        except (ProcessLookupError, PermissionError):
            pass


def stop_children(children, grace_secs, signum=signal.SIGTERM, watchdog=None):
    """Stops every child: `signum` to those still running (None: they were signalled
    already, and towerlib's scripts take a second signal as 'stop now, unsaved'), up
    to `grace_secs` for them to exit, then SIGKILL to every process of every child's
    session; reaps each, and tells `watchdog` (a reaper.Watchdog) which sessions are
    empty. Bounded: returns within grace_secs + a few seconds whatever they do.
    Returns the children still running at the grace's end (SIGKILLed then)."""
    for child in children:
        if signum is not None and child.status() is None:
            signal_child(child, signum)
    deadline = time.monotonic() + grace_secs
    while any(child.status() is None for child in children) and \
            time.monotonic() < deadline:
        time.sleep(0.05)
    overdue = [child for child in children if child.status() is None]
    for child in children:
        signal_child(child, signal.SIGKILL)
    for child in children:
        try:
            child.process.wait(timeout=5.0)
        except subprocess.TimeoutExpired:   # unkillable (in the kernel): not ours to fix
            pass
    for child in children:
        if reaper.kill_session(child.pid) and watchdog is not None:
            watchdog.closed(child.pid)
    for child in children:
        child.join_readers(timeout_secs=1.0)
    return overdue

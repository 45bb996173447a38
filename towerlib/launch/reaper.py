"""No process a task started outlives the launcher, however the launcher ends.

Each task starts a session of its own (children.start_child), and whatever it
starts stays in that session, in its process group or another (a wrapper
shell's `sleep`, a script's own workers), unless it calls setsid() itself.
So a task's processes are the members of its session, found in /proc:

- `kill_session` SIGKILLs every member (the launcher's stop, after the grace);
- a `Watchdog`, one small process per launcher (`python -S`, no towerlib),
  reads the sessions the launcher starts and ends on a pipe; when the pipe
  closes because the launcher died (a SIGKILL too, which the launcher cannot
  act on), it SIGKILLs every member of the sessions still open. A task's own
  PR_SET_PDEATHSIG reaches only the task itself, not what it started.

A session is closed (`Watchdog.closed`) at its attempt's end, once it has no
member left. Linux does not reuse a pid while it names a living session, so a
reused pid can be taken for a task's only if the launcher dies between a
task's end (its session empty) and its attempt's end: a window of seconds.
"""

import os
import signal
import subprocess
import sys
import time

__all__ = ["Watchdog", "kill_session", "session_members"]

_KILL_ROUNDS = 20   # a member forking while it is killed: look again, a bounded number of times

# The watchdog: lines '+S' / '-S' open and close session S; at end of input, every
# member of the open sessions is SIGKILLed. SIGINT and SIGHUP (the terminal's, meant
# for the launcher) are ignored: it ends when the launcher does.
_WATCHDOG = r"""
import os, signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGHUP, signal.SIG_IGN)
def members(sessions):
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open("/proc/%s/stat" % name) as stat:
                    fields = stat.read().rpartition(")")[2].split()
            except OSError:
                continue
            if int(fields[3]) in sessions and fields[0] not in "ZX":
                found.append(int(name))
    return found
sessions = set()
for line in sys.stdin:
    line = line.strip()
    if line[:1] == "+":
        sessions.add(int(line[1:]))
    elif line[:1] == "-":
        sessions.discard(int(line[1:]))
for _ in range(20):
    pids = members(sessions)
    if not pids:
        break
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    time.sleep(0.05)
"""


def session_members(session):
    """The pids of the living processes of `session` (its id: the leader's pid)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="ascii", errors="replace") as stat:
                fields = stat.read().rpartition(")")[2].split()
        except OSError:   # it ended while we looked
            continue
        if len(fields) > 3 and int(fields[3]) == session and fields[0] not in ("Z", "X"):
            found.append(int(name))
    return found


def kill_session(session):
    """SIGKILLs every process of `session`; returns whether none is left (bounded)."""
    for _ in range(_KILL_ROUNDS):
        pids = session_members(session)
        if not pids:
            return True
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.02)
    return not session_members(session)


class Watchdog:
    """The launcher's watchdog process (module text); `close()` ends it.

    Without /proc (not Linux) it does nothing: the tasks' process groups are
    still killed by the launcher, and PR_SET_PDEATHSIG is Linux's alone anyway.
    """

    def __init__(self):
        self._process = None
        if os.path.isdir("/proc/self"):
            self._process = subprocess.Popen(
                [sys.executable, "-S", "-c", _WATCHDOG], stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True)   # the terminal's Ctrl-C is the launcher's

    @property
    def pid(self):
        return None if self._process is None else self._process.pid

    def _send(self, line):
        if self._process is not None:
            try:
                self._process.stdin.write(line.encode() + b"\n")
                self._process.stdin.flush()
            except (OSError, ValueError):
                pass

    def opened(self, session):
        """A task's session started: kill its members if the launcher dies."""
        self._send(f"+{session}")

    def closed(self, session):
        """A task's session has no member left: forget it."""
        self._send(f"-{session}")

    def close(self):
        """Ends the watchdog (it kills the members of sessions still open)."""
        if self._process is None:
            return
        try:
            self._process.stdin.close()
        except OSError:
            pass
        try:
            self._process.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(timeout=5.0)
        self._process = None

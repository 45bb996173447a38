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

A process that leaves its session (a daemon's double fork and setsid()) is
found another way: the launcher is a child subreaper (PR_SET_CHILD_SUBREAPER),
so such a process, once its parent ends, becomes the launcher's child instead
of init's; `end_orphans` SIGKILLs and reaps those at each attempt's end (the
tasks' own children are never the launcher's). While the tasks run, the
launcher looks for such orphans every second (`orphan_sessions`) and tells the
watchdog their sessions, so that they die with a SIGKILLed launcher too; one
that the launcher has not seen yet (its first second) or whose parent still
runs goes to init if the launcher is SIGKILLed: only a cgroup (a scheduler's
job) holds it then.

The watchdog may die before the launcher (a person's SIGKILL): the launcher
checks it at every poll (`Watchdog.ensure`) and starts a new one that it tells
every open session, so that a launcher SIGKILLed afterwards still leaves
nothing behind.

A session is closed (`Watchdog.closed`) at its attempt's end, once it has no
member left. Linux does not reuse a pid while it names a living session, so a
reused pid can be taken for a task's only if the launcher dies between a
task's end (its session empty) and its attempt's end: a window of seconds.
"""

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time

__all__ = ["Watchdog", "become_subreaper", "end_orphans", "kill_session", "spawning",
           "orphan_sessions", "session_members"]

_PR_SET_CHILD_SUBREAPER, _PR_GET_CHILD_SUBREAPER = 36, 37

_KILL_ROUNDS = 20   # a member forking while it is killed: look again, a bounded number of times

# The watchdog: lines '+S' / '-S' open and close session S; at end of input, every
# member of the open sessions is SIGKILLed. SIGINT, SIGHUP and SIGUSR1 (the terminal's
# or a scheduler's, meant for the launcher) are ignored: it ends when the launcher does.
_WATCHDOG = r"""
import os, signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGHUP, signal.SIG_IGN)
signal.signal(signal.SIGUSR1, signal.SIG_IGN)
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


def _stat_fields(pid):
    """/proc/<pid>/stat's fields from the state on (index 0 the state, 1 the parent,
    3 the session, 19 the start time in clock ticks), or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rpartition(")")[2].split()
    except OSError:   # it ended while we looked
        return None


def session_members(session):
    """The pids of the living processes of `session` (its id: the leader's pid)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fields = _stat_fields(name)
        if fields and len(fields) > 3 and int(fields[3]) == session and \
                fields[0] not in ("Z", "X"):
            found.append(int(name))
    return found


def become_subreaper():
    """Makes this process a child subreaper (module text); returns whether it was one
    already (False also where prctl is missing: then nothing changes)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        was = ctypes.c_int(0)
        libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(was))
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1)
        return bool(was.value)
    except (OSError, AttributeError):
        return True


def stop_being_subreaper():
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 0)
    except (OSError, AttributeError):
        pass


def now_ticks():
    """Now, in clock ticks since boot (the unit of a process's start time in /proc)."""
    try:
        with open("/proc/uptime", encoding="ascii") as uptime:
            return int(float(uptime.read().split()[0]) * os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError):
        return 0


# Every process a launcher of this process started (tasks, watchdogs). Being a subreaper
# is a property of the whole process, so several launchers in one process (hosts
# simulated by threads) must not take each other's tasks for orphans. A child exists from
# its fork, before Popen returns its pid: the lock makes "started and recorded" one step
# for any scan for orphans, which holds it too.
_STARTED_HERE = set()
_SPAWN_LOCK = threading.Lock()


@contextlib.contextmanager
def spawning():
    """Starts a child as a launcher's own (never an orphan):

        with reaper.spawning() as record:
            process = record(subprocess.Popen(...))
    """
    def record(process):
        _STARTED_HERE.add(process.pid)
        return process

    with _SPAWN_LOCK:
        yield record


def _orphans(known, since):
    """This process's children that it did not start: not in `known` nor started by any
    launcher of this process, started at or after `since` (ticks), in another session
    than this process's."""
    me, own_session = os.getpid(), os.getsid(0)
    found = []
    with _SPAWN_LOCK:
        ours = set(known) | _STARTED_HERE
        names = [name for name in os.listdir("/proc") if name.isdigit() and int(name) not in ours]
    for name in names:
        fields = _stat_fields(name)
        if fields and len(fields) > 19 and int(fields[1]) == me and \
                int(fields[3]) != own_session and int(fields[19]) >= since:
            found.append((int(name), fields[0]))
    return found


def orphan_sessions(known, since):
    """{session id: [pids]} of the living orphans (_orphans) this subreaper holds."""
    found = {}
    for pid, state in _orphans(known, since):
        fields = _stat_fields(pid)
        if state not in ("Z", "X") and fields:
            found.setdefault(int(fields[3]), []).append(pid)
    return found


def end_orphans(known, since):
    """SIGKILLs and reaps the processes a task left that became this subreaper's
    children (module text); returns their pids. `known`: this process's own children
    (the tasks, the watchdog); `since`: the launcher's start (ticks). Bounded."""
    ended = []
    for _ in range(_KILL_ROUNDS):   # killing one may orphan its own children to us
        orphans = _orphans(known, since)
        if not orphans:
            break
        for pid, state in orphans:
            if state not in ("Z", "X"):
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            _reap(pid)
            ended.append(pid)
    return ended


def _reap(pid, timeout_secs=5.0):
    """Waits (bounded) for a SIGKILLed child `pid` to end and reaps it."""
    deadline = time.monotonic() + timeout_secs
    while True:
        try:
            if os.waitpid(pid, os.WNOHANG)[0] or time.monotonic() > deadline:
                return
        except ChildProcessError:   # reaped already, or not ours
            return
        time.sleep(0.01)


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
        self._open = set()
        self.restarts = 0
        if os.path.isdir("/proc/self"):
            self._start()

    def _start(self):
        with spawning() as record:
            self._process = record(subprocess.Popen(
                [sys.executable, "-S", "-c", _WATCHDOG], stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True))   # the terminal's Ctrl-C is the launcher's
        for session in sorted(self._open):
            self._send(f"+{session}")

    def ensure(self):
        """Starts a new watchdog, told every open session, if this one died; returns
        whether it had to."""
        if self._process is None or self._process.poll() is None:
            return False
        self.restarts += 1
        self._start()
        return True

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
        self._open.add(session)
        self._send(f"+{session}")

    def closed(self, session):
        """A task's session has no member left: forget it."""
        self._open.discard(session)
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

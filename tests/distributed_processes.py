"""Real cluster processes for the distributed tests, each bounded in time.

Every process runs a training program (by default examples/distributed/train.py)
in its own process group
(so a kill takes its children too), with its output in a log file, and dies
with the test process (PR_SET_PDEATHSIG). A watchdog kills every group once
the test's wall-clock budget is spent, and `close()` (a fixture teardown)
kills whatever is left, so a failing or hanging test leaks nothing.
"""

import ctypes
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

from towerlib.launch import ports as ports_lib

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(REPO_ROOT, "examples", "distributed", "train.py")

_PR_SET_PDEATHSIG = 1
try:  # loaded here, not in the forked child, where dlopen could deadlock
    _LIBC = ctypes.CDLL(None, use_errno=True)
except OSError:
    _LIBC = None


# Ports held_ports holds for the test under way; tests/conftest.py releases them after it.
_HELD = []


def held_ports(count):
    """`count` distinct free ports, held by this process until the test ends.

    Each stays bound (SO_REUSEPORT, never listening: towerlib.launch.ports) so that
    no other process, another xdist worker's test say, takes it before the cluster
    process meant for it binds; that process binds beside it because ProcessGroup
    sets TF_GRPC_REUSE_PORT=1. For processes this module starts; a program that
    must find the port free (towerlib's launcher probes fixed ports) uses free_ports.
    """
    held = ports_lib.hold_free_ports(count)
    _HELD.append(held)
    return list(held.ports)


def release_held_ports():
    """Releases every port held_ports holds (after each test)."""
    while _HELD:
        _HELD.pop().close()


def port_is_free(port):
    """Whether a plain bind (no SO_REUSEPORT) of 127.0.0.1:`port` succeeds now."""
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(count):
    """`count` distinct free TCP ports on 127.0.0.1 (bound to port 0, then released:
    another process may take one before it is used; held_ports closes that window)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _die_with_parent():
    """In the child before exec: SIGKILL it when the test process dies."""
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))


class ProcessGroup:
    """Starts, watches and always stops the processes of one test.

    Args:
      log_dir: where each process's combined stdout/stderr goes (NAME.log).
      budget_secs: hard wall-clock bound for every process of the test.
      command: the program every process runs, before its flags.
    """

    def __init__(self, log_dir, budget_secs, command=(sys.executable, EXAMPLE)):
        self.command = list(command)
        self.log_dir = str(log_dir)
        self.budget_secs = budget_secs
        self.started_at = time.monotonic()
        self.processes = {}
        self._log_files = []
        self._lock = threading.Lock()
        self._watchdog = threading.Timer(budget_secs, self.kill_all)
        self._watchdog.daemon = True
        self._watchdog.start()

    def start(self, name, flags, tf_config=None, extra_env=None):
        """Runs the command with `flags` (a list of '--flag=value') as `name`.

        tf_config: a dict for the TF_CONFIG environment variable, or None.
        extra_env: more environment variables (a scheduler's), or None.
        """
        env = dict(os.environ)
        env["PYTHONPATH"] = REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        env["CUDA_VISIBLE_DEVICES"] = ""
        env[ports_lib.REUSE_PORT_VARIABLE] = "1"   # binds beside held_ports' sockets
        env.pop("TF_CONFIG", None)
        if tf_config is not None:
            env["TF_CONFIG"] = json.dumps(tf_config)
        env.update(extra_env or {})
        log = open(self.log_path(name), "a", encoding="utf-8")
        self._log_files.append(log)
        log.write(f"### start {name}: {' '.join(flags)} TF_CONFIG={env.get('TF_CONFIG')}\n")
        log.flush()
        with self._lock:
            process = subprocess.Popen(
                self.command + list(flags), stdout=log,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                cwd=REPO_ROOT, start_new_session=True, preexec_fn=_die_with_parent)
            self.processes[name] = process
        return process

    def log_path(self, name):
        return os.path.join(self.log_dir, f"{name}.log")

    def log_text(self, name):
        with open(self.log_path(name), encoding="utf-8", errors="replace") as log:
            return log.read()

    def latest_log_text(self, name):
        """The log of `name`'s latest start only (a restarted process appends to its log)."""
        return self.log_text(name).split(f"### start {name}:")[-1]

    def describe(self, name, lines=25):
        """The tail of a process's log, for assertion messages."""
        tail = "\n".join(self.log_text(name).splitlines()[-lines:])
        return f"--- last lines of {name}.log ---\n{tail}"

    def remaining(self):
        return self.budget_secs - (time.monotonic() - self.started_at)

    def wait(self, name, timeout_secs):
        """Waits for `name` to exit; returns its exit code, fails on timeout."""
        timeout_secs = min(timeout_secs, max(self.remaining(), 0.1))
        try:
            return self.processes[name].wait(timeout=timeout_secs)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"{name} did not exit within {timeout_secs:.0f} s.\n"
                + self.describe(name)) from None

    def wait_for_log(self, name, pattern, timeout_secs):
        """Waits until `name`'s log matches the regex `pattern`; returns the last match."""
        deadline = time.monotonic() + min(timeout_secs, max(self.remaining(), 0.1))
        regex = re.compile(pattern)
        while True:
            matches = regex.findall(self.log_text(name))
            if matches:
                return matches[-1]
            if self.processes[name].poll() is not None:
                raise AssertionError(
                    f"{name} exited (code {self.processes[name].returncode}) before "
                    f"its log matched {pattern!r}.\n" + self.describe(name))
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{name}'s log did not match {pattern!r} within "
                    f"{timeout_secs:.0f} s.\n" + self.describe(name))
            time.sleep(0.05)

    def wait_for(self, condition, what, timeout_secs, watched):
        """Waits until `condition()` is truthy while process `watched` runs; returns it."""
        deadline = time.monotonic() + min(timeout_secs, max(self.remaining(), 0.1))
        while True:
            value = condition()
            if value:
                return value
            if self.processes[watched].poll() is not None:
                raise AssertionError(
                    f"{watched} exited (code {self.processes[watched].returncode}) "
                    f"before {what}.\n" + self.describe(watched))
            if time.monotonic() > deadline:
                raise AssertionError(f"No {what} within {timeout_secs:.0f} s.\n"
                                     + self.describe(watched))
            time.sleep(0.05)

    def signal(self, name, signum):
        """Sends `signum` (e.g. SIGSTOP) to `name`'s whole process group."""
        os.killpg(self.processes[name].pid, signum)

    def kill(self, name):
        """SIGKILLs `name`'s whole process group and reaps it."""
        process = self.processes[name]
        if process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        process.wait(timeout=10)

    def kill_all(self):
        with self._lock:
            names = list(self.processes)
        for name in names:
            self.kill(name)

    def close(self):
        """Stops the watchdog and kills every process still running."""
        self._watchdog.cancel()
        self.kill_all()
        for log in self._log_files:
            log.close()

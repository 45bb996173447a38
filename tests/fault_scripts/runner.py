"""Running fault scripts as subprocesses with hard wall-clock bounds.

Every process is started in its own session (so a signal meant for it
reaches nothing else), read by a thread (so a full pipe never blocks it),
and killed with SIGKILL by `ProcessPool.close` if still alive: a failing
test leaks no process.
"""

import os
import queue
import random
import re
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(HERE))
TRAIN_TINY = os.path.join(HERE, "train_tiny.py")


class TrainingProcess:
    """One script run; its stdout+stderr lines are kept in order."""

    def __init__(self, script, args):
        env = dict(os.environ, PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="2",
                   PYTHONPATH=os.pathsep.join(
                       filter(None, [REPO_ROOT, os.environ.get("PYTHONPATH")])))
        self.args = [str(a) for a in args]
        self.process = subprocess.Popen(
            [sys.executable, script, *self.args], stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO_ROOT,
            start_new_session=True)
        self.lines = []
        self._queue = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.process.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def _drain(self, timeout):
        try:
            line = self._queue.get(timeout=timeout)
        except queue.Empty:
            return False
        if line is None:
            self._queue.put(None)  # keep the end marker for later callers
            return None
        self.lines.append(line)
        return True

    @property
    def output(self):
        while self._drain(0):
            pass
        return "\n".join(self.lines)

    def wait_for_line(self, pattern, timeout):
        """The first match of `pattern` in a line, waiting at most `timeout` s."""
        regex = re.compile(pattern)
        for line in self.lines:
            match = regex.search(line)
            if match:
                return match
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self._drain(min(0.1, max(deadline - time.monotonic(), 0.01)))
            if got is None:
                break
            if got:
                match = regex.search(self.lines[-1])
                if match:
                    return match
        self.kill()
        raise AssertionError(f"No line matching {pattern!r} within {timeout}s.\n"
                             f"Output:\n{self.output[-4000:]}")

    def send(self, signum):
        self.process.send_signal(signum)

    def wait(self, timeout):
        """The return code; SIGKILLs the process and fails after `timeout` s."""
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"Process still running after {timeout}s; killed.\n"
                                 f"Output:\n{self.output[-4000:]}") from None
        self._reader.join(timeout=5)
        self.output  # noqa: B018  (collect the remaining lines)
        return code

    def kill(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)


class ProcessPool:
    """Starts TrainingProcesses and kills whatever is left at `close`."""

    def __init__(self):
        self.processes = []

    def start(self, script, args):
        process = TrainingProcess(script, args)
        self.processes.append(process)
        return process

    def train_tiny(self, train_dir, max_steps, *extra):
        return self.start(TRAIN_TINY, ["--train_dir", train_dir,
                                       "--max_steps", max_steps, *extra])

    def close(self):
        for process in self.processes:
            process.kill()
            if process.process.stdout:
                process.process.stdout.close()


def kill_at_random_moments(pool, script, args, kills, delays, timeout, seed):
    """Starts `script` `kills` times, each SIGKILLed a random delay (seconds, uniform
    in `delays`) after its first save line, unless it ended before.

    Returns [(delay, exit code), ...]: a resumed run can then be compared with an
    uninterrupted one.
    """
    moments = random.Random(seed)
    history = []
    for _ in range(kills):
        process = pool.start(script, args)
        process.wait_for_line(r"Saving checkpoint for step \d+ |nothing to train", timeout)
        delay = moments.uniform(*delays)
        try:
            process.process.wait(timeout=delay)
        except subprocess.TimeoutExpired:  # still running: the usual case
            process.send(signal.SIGKILL)
        history.append((round(delay, 2), process.wait(timeout)))
    return history

"""Every task's output, each line whole and prefixed with its task ('[worker 1] ...').

One reader thread per stream of each task copies the task's lines as they
come; a line is written with one write() under one lock, then flushed, so
lines of different tasks never mix mid-line (pytorch#60911) and a task's
stdout and stderr stay in the order the launcher read them. A task's last
line (of either stream) is kept for the summary, also for tasks whose
output is not shown (--tasks), and so is whether it logged a training step
(towerlib's progress line, 'step N, loss = ...', STEP_LINE), so that the
launcher can say when an attempt took no step at all.
"""

import re
import sys
import threading

__all__ = ["LAUNCHER_PREFIX", "Output", "STEP_LINE"]

LAUNCHER_PREFIX = b"[launch] "
# towerlib's progress line ('step 12, loss = 0.41, 0.2 sec/batch'; 'step 12/625, ...').
STEP_LINE = re.compile(r"\bstep \d+\b[^,]{0,20}, loss = ")


class Output:
    """Where the tasks' lines and the launcher's own notes go.

    Args:
      stdout, stderr: binary streams (default: this process's).
      shown: the tasks (launch.plan.Task) whose lines are written; None for all.
    """

    def __init__(self, stdout=None, stderr=None, shown=None):
        self._stdout = stdout if stdout is not None else sys.stdout.buffer
        self._stderr = stderr if stderr is not None else sys.stderr.buffer
        self._shown = shown
        self._lock = threading.Lock()
        self._last_lines = {}
        self._stepped = set()

    def _write(self, stream, data):
        with self._lock:
            try:
                stream.write(data)
                stream.flush()
            except (OSError, ValueError):
                # The reader of our output is gone (`| head`): drop the line, and go on
                # reading the task's, which would otherwise block on a full pipe.
                pass

    def note(self, text):
        """One line of the launcher's own, on stderr."""
        self._write(self._stderr, LAUNCHER_PREFIX + text.encode("utf-8", "replace") + b"\n")

    def task_line(self, task, line, to_stderr=False):
        """Writes one line of `task`'s (bytes, with or without its newline)."""
        line = line.rstrip(b"\r\n")
        if line.strip():
            text = line.decode("utf-8", "replace")
            with self._lock:
                self._last_lines[task] = text
                if task not in self._stepped and STEP_LINE.search(text):
                    self._stepped.add(task)
        if self._shown is None or task in self._shown:
            prefix = f"[{task.name}] ".encode()
            self._write(self._stderr if to_stderr else self._stdout, prefix + line + b"\n")

    def last_line(self, task):
        """The last non-blank line `task` wrote, '' if none."""
        with self._lock:
            return self._last_lines.get(task, "")

    def stepped(self, task):
        """Whether `task` logged a training step (STEP_LINE) since it was forgotten."""
        with self._lock:
            return task in self._stepped

    def forget(self, task):
        """Drops `task`'s last line and steps (a restarted task starts new ones)."""
        with self._lock:
            self._last_lines.pop(task, None)
            self._stepped.discard(task)

    def follow(self, task, stream, to_stderr=False):
        """Starts a daemon thread copying `stream`'s lines until its end; returns it."""
        def copy():
            try:
                with stream:
                    for line in iter(stream.readline, b""):
                        self.task_line(task, line, to_stderr)
            except (OSError, ValueError):   # the stream closed under us: nothing more
                pass

        thread = threading.Thread(target=copy, name=f"launch-{task.key}-"
                                  f"{'err' if to_stderr else 'out'}", daemon=True)
        thread.start()
        return thread

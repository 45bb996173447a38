"""Every task's output, each line whole and prefixed with its task ('[worker 1] ...').

One reader thread per stream of each task copies the task's lines as they
come; a line is written with one write() under one lock, then flushed, so
lines of different tasks never mix mid-line (pytorch#60911) and a task's
stdout and stderr stay in the order the launcher read them. A task's last
line (of either stream) is kept for the summary, also for tasks whose
output is not shown (--tasks).
"""

import sys
import threading

__all__ = ["LAUNCHER_PREFIX", "Output"]

LAUNCHER_PREFIX = b"[launch] "


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
            with self._lock:
                self._last_lines[task] = line.decode("utf-8", "replace")
        if self._shown is None or task in self._shown:
            prefix = f"[{task.name}] ".encode()
            self._write(self._stderr if to_stderr else self._stdout, prefix + line + b"\n")

    def last_line(self, task):
        """The last non-blank line `task` wrote, '' if none."""
        with self._lock:
            return self._last_lines.get(task, "")

    def forget(self, task):
        """Drops `task`'s last line (a restarted task starts a new one)."""
        with self._lock:
            self._last_lines.pop(task, None)

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

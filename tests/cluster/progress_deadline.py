"""A wait bounded by progress, not by one fixed budget: under load a run is slower, not
stuck, so it may take as long as it keeps moving.

    deadline = ProgressDeadline(events_file, stall_secs=240, cap_secs=1800)
    while not done():
        assert not deadline.passed(), deadline.reason()

The file grows by a line per event the run writes (a step, a start); each growth starts
the stall clock again. The wait ends when nothing was written for `stall_secs`, or at
`cap_secs` whatever happens (every wait has a bound).
"""

import os
import time


class ProgressDeadline:
    def __init__(self, path, stall_secs, cap_secs):
        self.path, self.stall_secs, self.cap_secs = path, stall_secs, cap_secs
        self.began = self._last_change = time.monotonic()
        self._size = -1

    def _refresh(self):
        try:
            size = os.path.getsize(self.path)
        except OSError:
            size = -1
        if size != self._size:
            self._size, self._last_change = size, time.monotonic()

    def passed(self):
        self._refresh()
        now = time.monotonic()
        return now - self._last_change > self.stall_secs or now - self.began > self.cap_secs

    def reason(self):
        now = time.monotonic()
        if now - self.began > self.cap_secs:
            return f"still running after the cap of {self.cap_secs} s"
        return (f"no progress for {self.stall_secs} s ({os.path.basename(self.path)} "
                f"unchanged; {now - self.began:.0f} s in all)")

    def join(self, thread):
        """Waits for `thread` while the run progresses; True when it ended."""
        while thread.is_alive() and not self.passed():
            thread.join(1.0)
        return not thread.is_alive()

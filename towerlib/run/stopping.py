"""Graceful stop: SIGINT or SIGTERM finishes the step, saves, and ends training.

A scheduler preempting a job sends SIGTERM (then SIGKILL after a grace
period); a person at the terminal presses Ctrl-C (SIGINT). Either one, while
`run_training` runs, only sets a flag: the step in flight completes (Python
runs signal handlers between bytecodes, so never inside `session.run`), the
hook asks the session to stop, and the checkpoint hook's `end` writes a
final checkpoint. The first signal also puts the previous handlers back, so a
second one acts as it would without towerlib (Ctrl-C raises
KeyboardInterrupt, SIGTERM kills): an impatient user can still stop at once,
and the crash-safe checkpoints keep the last saved one restorable.

While no step can finish (a session being created or recreated after a
failed step), a signal ends the run at once: `stop_at_once` makes the
handler raise StopSignalReceived, which run_training turns into a stop
without a final checkpoint (the last saved one stays the newest).
"""

import contextlib
import logging
import signal
import threading

import tensorflow as tf

from towerlib.checks.loop_options import DEFAULT_SIGNALS  # noqa: F401 (re-exported)

logger = logging.getLogger("towerlib")


class StopSignalReceived(BaseException):
    """A stop signal arrived while no step could finish; not an Exception, so
    that no `except Exception` on the way swallows it (as KeyboardInterrupt)."""

    def __init__(self, signum):
        self.signum = signum
        super().__init__(f"{signal.Signals(signum).name} received while the session "
                         "was being created: training stopped.")


class SignalStopHook(tf.compat.v1.train.SessionRunHook):
    """Requests a clean stop when one of `signals` arrives.

    Install with `install()` (the MonitoredSession calls `begin`, which does
    it) and always `uninstall()` in a `finally`: `end` is not called when
    training raises. Signal handlers can only be set from the main thread;
    elsewhere the hook logs a warning and does nothing.

    Attributes:
      received: the number of the first signal received, or None.
    """

    def __init__(self, signals=DEFAULT_SIGNALS):
        self.signals = tuple(signals)
        self.received = None
        self._previous = {}
        self._at_once = False

    def install(self):
        if self._previous:
            return
        if threading.current_thread() is not threading.main_thread():
            logger.warning("run_training is not in the main thread, so SIGINT/SIGTERM "
                           "cannot be caught: a signal will stop training without a "
                           "final checkpoint (the last periodic one stays restorable).")
            return
        for signum in self.signals:
            self._previous[signum] = signal.signal(signum, self._handle)

    def uninstall(self):
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def _handle(self, signum, frame):
        del frame
        if self.received is None:
            self.received = signum
        self.uninstall()
        if self._at_once:
            logger.warning("Received %s while a session was being created: stopping "
                           "now, without a final checkpoint.", signal.Signals(signum).name)
            raise StopSignalReceived(signum)
        logger.warning("Received %s: finishing this step, saving a checkpoint and "
                       "stopping. Send it again to stop at once without saving.",
                       signal.Signals(signum).name)

    @contextlib.contextmanager
    def stop_at_once(self):
        """Within: a signal raises StopSignalReceived (also one received before)."""
        if self.received is not None:
            raise StopSignalReceived(self.received)
        self._at_once = True
        try:
            yield
        finally:
            self._at_once = False

    @property
    def received_name(self):
        return signal.Signals(self.received).name if self.received else None

    def begin(self):
        self.install()

    def after_run(self, run_context, run_values):
        if self.received is not None:
            run_context.request_stop()

    def end(self, session):
        self.uninstall()

"""StepDeadlineHook: every run bounded by the deadline, one watcher thread for the loop,
and a line while a run waits longer than log_every_secs."""

import logging
import threading
import time

import pytest

from towerlib.cluster import StepDeadlineHook, replica_watch


def watchers():
    return [t for t in threading.enumerate() if t.name == "towerlib-step-watch"]


def test_many_runs_share_one_watcher_and_carry_the_deadline(monkeypatch):
    started = []

    class CountedThread(threading.Thread):
        def start(self):
            started.append(self.name)
            super().start()

    monkeypatch.setattr(replica_watch.threading, "Thread", CountedThread)
    before = len(watchers())
    hook = StepDeadlineHook(deadline_secs=2.5, log_every_secs=0.05)
    for _ in range(50):
        args = hook.before_run(None)
        assert args.options.timeout_in_ms == 2500
        hook.after_run(None, None)
    assert started == ["towerlib-step-watch"]  # one for the loop, not one per step
    assert len(watchers()) == before + 1
    hook.end(None)
    ended = time.monotonic() + 10   # the watcher sees the end within one period
    while len(watchers()) > before and time.monotonic() < ended:
        time.sleep(0.01)
    assert len(watchers()) == before


def test_a_run_that_waits_is_said_while_it_waits(caplog):
    caplog.set_level(logging.INFO, logger="towerlib")
    hook = StepDeadlineHook(deadline_secs=60, log_every_secs=0.5)
    hook.before_run(None)
    time.sleep(1.6)   # said at about 0.5, 1.0 and 1.5 s
    hook.after_run(None, None)
    lines = [r.getMessage() for r in caplog.records if "waiting" in r.getMessage()]
    assert lines and all(line.startswith("run 1 of this replica: waiting") for line in lines)
    assert "(deadline 60 s)" in lines[0]
    started = time.monotonic()
    hook.before_run(None)  # a quick run says nothing
    hook.after_run(None, None)
    quick = time.monotonic() - started < 0.5   # unless this thread stalled that long
    time.sleep(0.6)
    hook.end(None)
    later = [r.getMessage() for r in caplog.records if "waiting" in r.getMessage()]
    assert later[:len(lines)] == lines   # run 1 said nothing after its after_run
    if quick:
        assert later == lines


def test_no_line_of_a_run_comes_after_its_after_run(caplog):
    """A line being said while the run ends is complete when after_run returns:
    the handler below is slow, and after_run waits for it instead of racing it."""
    said, saying = [], threading.Event()

    class SlowHandler(logging.Handler):
        def emit(self, record):
            saying.set()
            time.sleep(0.3)
            said.append(record.getMessage())

    handler = SlowHandler(level=logging.INFO)
    log = logging.getLogger("towerlib")
    log.addHandler(handler)
    caplog.set_level(logging.INFO, logger="towerlib")
    try:
        hook = StepDeadlineHook(deadline_secs=60, log_every_secs=0.05)
        hook.before_run(None)
        assert saying.wait(10)
        hook.after_run(None, None)
        count = len(said)
        time.sleep(0.5)
        hook.end(None)
    finally:
        log.removeHandler(handler)
    assert count >= 1 and len(said) == count, said


def test_a_deadline_must_be_positive():
    with pytest.raises(ValueError, match="must be > 0 seconds"):
        StepDeadlineHook(deadline_secs=0)


def test_a_run_is_said_one_period_after_its_own_start(caplog):
    """The line comes log_every_secs after the waiting run began, whenever the runs
    before it began: a run shorter than two periods (say a deadline of 8 s with a
    line every 5 s) is still said before its deadline."""
    caplog.set_level(logging.INFO, logger="towerlib")
    hook = StepDeadlineHook(deadline_secs=60, log_every_secs=2.0)
    hook.before_run(None)  # run 1, quick
    hook.after_run(None, None)
    time.sleep(0.1)
    # Run 2 waits 3.5 s: said at 2.0 s into it. A line timed from run 1's start
    # (the watcher waking at 2.0 s and then waiting a whole period) would come at
    # 3.9 s into run 2, after it ended.
    hook.before_run(None)
    time.sleep(3.5)
    hook.after_run(None, None)
    hook.end(None)
    lines = [r.getMessage() for r in caplog.records if "waiting" in r.getMessage()]
    # run 2 may be said twice if the machine is slow enough to stretch its 1.3 s past 2 s
    assert lines and {line.split(":")[0] for line in lines} == {"run 2 of this replica"}, lines

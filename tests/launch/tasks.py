"""Helpers of the launcher's tests: the fake task's command, its records, live processes."""

import glob
import json
import os
import sys
import time

FAKE_TASK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_task.py")


def fake_command(record_dir, *flags):
    return [sys.executable, FAKE_TASK, "--record", str(record_dir), *flags]


def records(record_dir):
    """{'worker-1-0': record, ...}: what each started fake task wrote (job-index-restart)."""
    found = {}
    for path in glob.glob(os.path.join(str(record_dir), "*.json")):
        with open(path) as record:
            found[os.path.basename(path)[:-len(".json")]] = json.load(record)
    return found


def alive(pid):
    """Whether `pid` runs (a zombie waiting for its parent to reap it does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            state = stat.read().rpartition(")")[2].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def recorded_pids(record_dir):
    """Every pid the fake tasks recorded: their own and their grandchildren's."""
    pids = []
    for record in records(record_dir).values():
        pids.append(record["pid"])
        if "grandchild" in record:
            pids.append(record["grandchild"])
    return pids


def wait_until(condition, timeout_secs, what):
    """Polls `condition` until it is truthy; fails naming `what` after timeout_secs."""
    deadline = time.monotonic() + timeout_secs
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout_secs} s")
        time.sleep(0.05)


def assert_none_alive(record_dir, timeout_secs=5.0):
    """Every recorded process is gone (within a short bound for the kernel to finish)."""
    pids = recorded_pids(record_dir)
    assert pids, "the tasks recorded no pid"
    wait_until(lambda: not [pid for pid in pids if alive(pid)], timeout_secs,
               f"end of every task process ({[pid for pid in pids if alive(pid)]} alive)")

"""A test that needs the machine to itself takes it; every other test shares it.

A local Ray cluster is a dozen processes (raylets, agents, prestarted workers, Ray
Train's actors) on top of the training workers. Sharing the 2 cores with the other
pytest-xdist worker's TensorFlow, a Ray Train worker group took 3 minutes to start,
and a first trainer.fit() made no step for 240 s. So under xdist, a test marked
`one_ray_cluster` holds the machine exclusively, and every other test holds a share
(a readers-writer lock of two flocks, fixture `machine_share` in tests/conftest.py):

    with machine(exclusive=True):    # waits for the running shares to end
        ...
    with machine(exclusive=False):   # waits while an exclusive holder runs or waits
        ...

An exclusive holder first takes the INTENT lock, so that no new share starts, then
waits for the shares that run to end. Each wait is bounded (WAIT_SECS: the longest
test's cap). The lock files are named by the run (xdist's testrunuid), in the
temporary folder; `remove_files` deletes the run's own at its end.
"""

import contextlib
import fcntl
import glob
import os
import tempfile
import time

import pytest

WAIT_SECS = 2700   # the longest test's cap (test_ray_elastic: 2400 s), and its shutdown


def _files(run_id):
    stem = os.path.join(tempfile.gettempdir(), f"towerlib-tests-machine-{run_id}")
    return f"{stem}.intent", f"{stem}.share"


def _lock(handle, mode, deadline, what):
    while True:
        try:
            fcntl.flock(handle, mode | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                pytest.fail(f"waited more than {WAIT_SECS} s for {what} "
                            "(tests/machine_share.py)")
            time.sleep(0.2)


@contextlib.contextmanager
def machine(exclusive, run_id, wait_secs=WAIT_SECS):
    intent_path, share_path = _files(run_id)
    deadline = time.monotonic() + wait_secs
    with open(intent_path, "a", encoding="utf-8") as intent, \
            open(share_path, "a", encoding="utf-8") as share:
        if exclusive:
            _lock(intent, fcntl.LOCK_EX, deadline, "another test holding the machine")
            try:
                _lock(share, fcntl.LOCK_EX, deadline, "the other worker's test to end")
                yield
            finally:
                fcntl.flock(share, fcntl.LOCK_UN)
                fcntl.flock(intent, fcntl.LOCK_UN)
        else:
            _lock(intent, fcntl.LOCK_SH, deadline, "a test that holds the machine")
            fcntl.flock(intent, fcntl.LOCK_UN)
            _lock(share, fcntl.LOCK_SH, deadline, "a test that holds the machine")
            try:
                yield
            finally:
                fcntl.flock(share, fcntl.LOCK_UN)


def remove_files(run_id):
    for path in _files(run_id):
        for found in glob.glob(path):
            os.remove(found)

"""One Ray cluster at a time on this machine, whichever pytest-xdist worker starts it.

Two local Ray clusters started at once (the suite's xdist workers each running a Ray
test) compete for the 2 cores and for Ray's ports and start-up files; a Ray Train run
then made no step for 240 s. Each Ray test holds this lock while its cluster lives:

    with one_ray_cluster_at_a_time():
        ... start the cluster, train, shut it down ...

The lock is an flock on a file in the temporary folder (created if missing, never
truncated or removed), released when the test ends or its process dies. The wait is
bounded: another test's cluster lives at most a Ray test's cap.
"""

import contextlib
import fcntl
import os
import tempfile
import time

import pytest

LOCK_FILE = os.path.join(tempfile.gettempdir(), "towerlib-tests-ray-cluster.lock")
WAIT_SECS = 2700   # the longest Ray test's cap (test_ray_elastic: 2400 s), and its shutdown


@contextlib.contextmanager
def one_ray_cluster_at_a_time(wait_secs=WAIT_SECS):
    with open(LOCK_FILE, "a", encoding="utf-8") as handle:
        deadline = time.monotonic() + wait_secs
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    pytest.fail(f"another test's Ray cluster held {LOCK_FILE} for more "
                                f"than {wait_secs} s")
                time.sleep(1.0)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)

"""The readers-writer lock of tests/machine_share.py: an exclusive holder waits for the
running shares, and no new share starts while it waits or runs."""

import threading
import time
import uuid

from tests import machine_share


def test_an_exclusive_holder_waits_for_shares_and_blocks_new_ones():
    run_id = f"selftest-{uuid.uuid4().hex}"
    events = []
    first_share_in = threading.Event()
    release_first = threading.Event()

    def first_share():
        with machine_share.machine(False, run_id, wait_secs=30):
            events.append("share 1 in")
            first_share_in.set()
            release_first.wait(30)
            events.append("share 1 out")

    def exclusive():
        with machine_share.machine(True, run_id, wait_secs=30):
            events.append("exclusive in")
            time.sleep(0.5)
            events.append("exclusive out")

    def second_share():
        with machine_share.machine(False, run_id, wait_secs=30):
            events.append("share 2 in")

    try:
        threads = [threading.Thread(target=first_share)]
        threads[0].start()
        assert first_share_in.wait(30)
        threads.append(threading.Thread(target=exclusive))
        threads[1].start()
        time.sleep(0.5)   # the exclusive holder has its intent now, and waits
        threads.append(threading.Thread(target=second_share))
        threads[2].start()
        time.sleep(0.5)
        assert events == ["share 1 in"]   # neither the exclusive holder nor a new share
        release_first.set()
        for thread in threads:
            thread.join(30)
        assert events == ["share 1 in", "share 1 out", "exclusive in", "exclusive out",
                          "share 2 in"]
    finally:
        release_first.set()
        machine_share.remove_files(run_id)

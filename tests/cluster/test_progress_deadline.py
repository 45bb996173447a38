"""The Ray tests' wait: bounded by progress (a file that grows), and by a cap."""

import threading
import time

from tests.cluster.progress_deadline import ProgressDeadline


def test_a_growing_file_extends_the_wait_and_a_stall_ends_it(tmp_path):
    events = tmp_path / "events.txt"
    stop = threading.Event()

    def writer():  # a line every 0.1 s for 1 s, then nothing
        with open(events, "a") as out:
            for _ in range(10):
                out.write("step\n")
                out.flush()
                time.sleep(0.1)
        stop.wait(10)

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    deadline = ProgressDeadline(str(events), stall_secs=0.5, cap_secs=30)
    began = time.monotonic()
    assert not deadline.join(thread)          # the writer still runs: the stall ended it
    waited = time.monotonic() - began
    assert 1.0 <= waited < 5.0, waited        # past the 0.5 s stall thanks to the growth
    assert "no progress for 0.5 s" in deadline.reason()
    stop.set()
    thread.join(5)


def test_the_cap_ends_a_wait_that_keeps_progressing(tmp_path):
    events = tmp_path / "events.txt"
    deadline = ProgressDeadline(str(events), stall_secs=60, cap_secs=0.3)
    events.write_text("x")
    time.sleep(0.4)
    assert deadline.passed() and "cap of 0.3 s" in deadline.reason()

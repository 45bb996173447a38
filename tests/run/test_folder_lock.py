"""One trainer per train_dir: a second one is refused in one line naming
the folder and the holder's pid; a killed holder leaves nothing stuck."""

import os
import re
import signal

import pytest

from towerlib.run import checkpoints, folder_lock

TIMEOUT = 120


def test_a_second_hold_is_refused_until_the_first_is_released(tmp_path):
    first = folder_lock.hold(tmp_path)
    with pytest.raises(folder_lock.TrainDirInUseError) as raised:
        folder_lock.hold(tmp_path)
    line = str(raised.value)
    assert "\n" not in line
    assert f"{tmp_path} is in use: process pid {os.getpid()} on " in line
    assert "another train_dir" in line
    first.release()
    first.release()  # idempotent
    folder_lock.hold(tmp_path).release()


@pytest.mark.slow
def test_two_trainers_on_one_train_dir_and_a_killed_one(pool, tmp_path):
    train_dir = str(tmp_path / "train")
    first = pool.train_tiny(train_dir, 100000, "--save_every", 2, "--step_sleep", 0.05)
    first.wait_for_line(r"^STEP 3$", TIMEOUT)
    second = pool.train_tiny(train_dir, 10)
    assert second.wait(TIMEOUT) == 1, second.output
    assert re.search(rf"TrainDirInUseError: {re.escape(train_dir)} is in use: process pid "
                     rf"{first.process.pid} on \S+ is training into it", second.output), \
        second.output
    assert "START STEP" not in second.output  # refused before any session or restore
    first.send(signal.SIGKILL)
    first.wait(TIMEOUT)
    # The kernel dropped the dead process's lock: a new trainer resumes.
    last = checkpoints.checkpoint_step(checkpoints.find_restorable_checkpoint(train_dir))
    third = pool.train_tiny(train_dir, last + 2, "--save_every", 2)
    assert third.wait(TIMEOUT) == 0, third.output
    assert f"START STEP {last}" in third.output and f"DONE step={last + 2}" in third.output

"""SIGTERM and SIGINT: the step finishes, a final checkpoint is saved, exit 0."""

import re
import signal

import pytest

from towerlib.run import checkpoints

TIMEOUT = 90

# Starts training processes (the `pool` fixture, tests/conftest.py) and signals them.
pytestmark = pytest.mark.slow


def test_sigterm_and_sigint_save_a_final_checkpoint_and_exit_cleanly(pool, tmp_path):
    # Checkpoints every 1000 steps: besides step 0, only the signal can cause one.
    jobs = {}
    for signum in (signal.SIGTERM, signal.SIGINT):
        train_dir = str(tmp_path / signum.name)
        jobs[signum] = (train_dir, pool.train_tiny(
            train_dir, 100000, "--save_every", 1000, "--step_sleep", 0.05))
    for signum, (_, process) in jobs.items():
        process.wait_for_line(r"^STEP 3$", TIMEOUT)
        process.send(signum)

    for signum, (train_dir, process) in jobs.items():
        assert process.wait(TIMEOUT) == 0, process.output
        output = process.output
        assert f"Received {signum.name}: finishing this step, saving a checkpoint" in output
        done = re.search(r"^DONE step=(\d+) signal=(\w+) checkpoint=(\S+)$", output, re.M)
        assert done, output
        step = int(done.group(1))
        assert done.group(2) == signum.name
        steps_run = [int(s) for s in re.findall(r"^STEP (\d+)$", output, re.M)]
        assert step == max(steps_run) and 3 <= step < 100000
        # The final checkpoint is the last step run, complete, and the latest.
        assert done.group(3).endswith(f"model.ckpt-{step}"), output
        latest = checkpoints.find_restorable_checkpoint(train_dir)
        assert checkpoints.checkpoint_step(latest) == step
        assert checkpoints.checkpoint_problem(latest) is None
        assert [checkpoints.checkpoint_step(p)
                for p in checkpoints.read_state(train_dir)] == [0, step]


def test_a_signal_stops_a_run_whose_session_is_being_recreated(pool, tmp_path):
    # Every step aborts: no step ever completes, so a stop requested "after the
    # step" would never come (a SIGTERM was swallowed).
    train_dir = str(tmp_path / "train")
    process = pool.train_tiny(train_dir, 100, "--abort_every_step",
                              "--max_recreations", 100000)
    process.wait_for_line(r"session is being recreated", TIMEOUT)
    process.wait_for_line(r"^ABORTING$", TIMEOUT)
    process.send(signal.SIGTERM)
    assert process.wait(TIMEOUT) == 0, process.output
    output = process.output
    assert re.search(r"^DONE step=0 signal=SIGTERM checkpoint=\S+model.ckpt-0$", output,
                     re.M), output
    assert checkpoints.checkpoint_step(checkpoints.find_restorable_checkpoint(train_dir)) == 0


def test_session_recreation_ends_in_one_error_in_a_real_process(pool, tmp_path):
    process = pool.train_tiny(str(tmp_path / "train"), 100, "--abort_every_step",
                              "--max_recreations", 3)
    assert process.wait(TIMEOUT) == 1, process.output
    assert "SessionRecreationError: The session was recreated 3 times" in process.output

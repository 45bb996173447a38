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

"""SIGKILL a real training process at different moments; it resumes losslessly.

The tiny model's data is a function of the global step (tests/fault_scripts/
tiny_model.py), so a resumed run is the same computation as an uninterrupted
one: the final checkpoint must equal the reference run's bit for bit
(weights, Momentum slots and global_step), and each restart must start from
the newest complete checkpoint on disk, never losing a step behind it.
"""

import os
import re
import signal

import numpy as np
import pytest

from tests.fault_scripts import tiny_model
from towerlib.run import checkpoints

MAX_STEPS = 16
SAVE_EVERY = 2
KEEP = 2
TIMEOUT = 90  # seconds per process, far above the ~5 s each takes

# Starts training processes (the `pool` fixture, tests/conftest.py) and kills them.
pytestmark = pytest.mark.slow


def _args():
    return ["--save_every", SAVE_EVERY, "--keep", KEEP]


def _newest_complete_step(train_dir):
    prefix = checkpoints.find_restorable_checkpoint(train_dir)
    return checkpoints.checkpoint_step(prefix) if prefix else 0


def _start_step(process):
    return int(process.wait_for_line(r"^START STEP (\d+)", TIMEOUT).group(1))


def _last_step_run(process):
    steps = [int(m) for m in re.findall(r"^STEP (\d+)$", process.output, re.M)]
    return max(steps, default=0)


def test_sigkill_at_many_moments_then_resume_matches_uninterrupted_run(pool, tmp_path):
    reference_dir = str(tmp_path / "reference")
    reference = pool.train_tiny(reference_dir, MAX_STEPS, *_args())

    killed_dir = str(tmp_path / "killed")
    history = []

    def run(*extra, kill_when=None):
        """One life of the job; returns (start step, return code, last step run)."""
        expected_start = _newest_complete_step(killed_dir)
        process = pool.train_tiny(killed_dir, MAX_STEPS, *_args(), *extra)
        start = _start_step(process)
        # Resumes exactly from the newest complete checkpoint on disk.
        assert start == expected_start, process.output
        if kill_when is not None:
            process.wait_for_line(kill_when, TIMEOUT)
            process.send(signal.SIGKILL)
        code = process.wait(TIMEOUT)
        last = _last_step_run(process)
        history.append((extra, kill_when, start, code, last))
        if code == -signal.SIGKILL:
            # No step is lost beyond the save interval: the newest complete
            # checkpoint is at most SAVE_EVERY steps behind the last step run.
            assert _newest_complete_step(killed_dir) >= last - SAVE_EVERY, history
        return start, code, last

    # Outside kills: steps are slowed down (0.3 s each, in a hook after the
    # step) so that the process cannot finish before the signal lands.
    slow = ("--step_sleep", 0.3)
    # 1. From outside, between two saves.
    assert run(*slow, kill_when=r"^STEP 3$")[1] == -signal.SIGKILL
    # 2. From outside, as soon as a save is announced (lands in or just after it).
    assert run(*slow, kill_when=r"Saving checkpoint for step 6 ")[1] == -signal.SIGKILL
    # 3-6. From inside, at exact points of the checkpoint protocol.
    for die_at, newest_after in (("stage:8", 6), ("index:10", 8),
                                 ("state:12", 12), ("delete:10", 14)):
        start, code, last = run("--die_at", die_at)
        assert code == -signal.SIGKILL, (die_at, history)
        assert _newest_complete_step(killed_dir) == newest_after, (die_at, history)
    # The index:10 kill left step 10's data without an index: never restored.
    # The state:12 kill left step 12 complete but unlisted: the next run
    # resumed from it (checked by the start-step assertion above).
    start, code, last = run()
    assert (start, code, last) == (14, 0, MAX_STEPS), history

    assert reference.wait(TIMEOUT) == 0, reference.output
    final = tiny_model.checkpoint_values(os.path.join(killed_dir, f"model.ckpt-{MAX_STEPS}"))
    expected = tiny_model.checkpoint_values(
        os.path.join(reference_dir, f"model.ckpt-{MAX_STEPS}"))
    assert sorted(final) == sorted(expected)
    assert any("Momentum" in name for name in final)  # slots are compared too
    assert int(final["global_step"]) == MAX_STEPS
    for name in expected:
        np.testing.assert_array_equal(final[name], expected[name], err_msg=name)

    # Nothing half-written is left behind, and the state lists complete ones only.
    leftovers = [n for n in os.listdir(killed_dir)
                 if ".tmp" in n or "tempstate" in n or n.endswith("_temp")]
    assert leftovers == []
    assert os.listdir(os.path.join(killed_dir, checkpoints.SAVING_DIRNAME)) == []
    listed = checkpoints.read_state(killed_dir)
    assert [checkpoints.checkpoint_step(p) for p in listed] == [MAX_STEPS - 2, MAX_STEPS]
    assert all(checkpoints.checkpoint_problem(p) is None for p in listed)

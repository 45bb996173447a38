"""Killed anywhere in an accumulated step, a run resumes into the run it would have been.

The CIFAR-10 train script with --accumulation_steps=3 (the towers run the
step's micro-batches in one loop within one session run) and replicated
variables, SIGKILLed at random moments, then resumed: its last checkpoint is
bit-identical to an uninterrupted run's (weights, slots, moving statistics,
EMA, global step). A checkpoint holds no half step, and the loop's sums are
step-local: nothing of a killed step survives into the resumed one.
"""

import os
import signal

import pytest

from examples.cifar10 import generate, run_folder
from tests.examples.test_cifar10_exact_runs import assert_bit_identical
from tests.fault_scripts import runner

TRAIN_SCRIPT = os.path.join(runner.REPO_ROOT, "examples", "cifar10", "train.py")
MAX_STEPS = 12
TIMEOUT = 120
KILLS = 2

pytestmark = pytest.mark.slow  # trains the example in processes that are killed


def _flags(train_dir, data_dir):
    return [f"--train_dir={train_dir}", f"--data_dir={data_dir}", "--model=resnet8",
            "--num_towers=2", "--device_type=cpu", "--global_batch_size=18",
            "--accumulation_steps=3", "--variable_update=replicated",
            f"--max_steps={MAX_STEPS}", "--save_checkpoint_steps=3",
            "--log_every_n_steps=3", "--ema_decay=0.9", "--seed=5"]


def test_sigkill_during_accumulated_steps_then_resume_is_bit_identical(pool, tmp_path):
    data_dir = str(tmp_path / "data")
    generate.generate(data_dir, train_per_file=20, test_examples=10)
    reference_dir, killed_dir = str(tmp_path / "reference"), str(tmp_path / "killed")
    reference = pool.start(TRAIN_SCRIPT, _flags(reference_dir, data_dir))
    history = runner.kill_at_random_moments(pool, TRAIN_SCRIPT, _flags(killed_dir, data_dir),
                                            KILLS, (0.5, 3.0), TIMEOUT, seed=os.getpid())
    print("kills (delay, exit code):", history, "restorable:",
          run_folder.checkpoint_step(killed_dir))
    final = pool.start(TRAIN_SCRIPT, _flags(killed_dir, data_dir))
    assert final.wait(TIMEOUT) == 0, final.output[-3000:]
    assert reference.wait(TIMEOUT) == 0, reference.output[-3000:]
    assert any(code == -signal.SIGKILL for _, code in history), history
    last = f"model.ckpt-{MAX_STEPS}"
    assert_bit_identical(os.path.join(killed_dir, last), os.path.join(reference_dir, last))

"""Exact runs: the CIFAR-10 train script resumes into the very run it would have
run uninterrupted, and one seed repeats a run bit for bit.

A tiny generated data set (200 training examples) and resnet8 on 2 CPU towers, with
shuffling and augmentation on: the global batch of a step is fixed by the seed and the
step (towerlib.global_batch_input), its position in every checkpoint, and the
augmentation is stateless, seeded per example and epoch.
"""

import os
import signal

import numpy as np
import pytest
import tensorflow as tf

from examples.cifar10 import generate, job
from tests.fault_scripts import runner

TRAIN_SCRIPT = os.path.join(runner.REPO_ROOT, "examples", "cifar10", "train.py")
MAX_STEPS = 48
TIMEOUT = 120
KILLS = 5

pytestmark = pytest.mark.slow  # trains the example, in processes that are killed


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    """5 x 40 training and 50 test examples in the CIFAR-10 file format."""
    data_dir = str(tmp_path_factory.mktemp("tiny_cifar"))
    generate.generate(data_dir, train_per_file=40, test_examples=50)
    return data_dir


def _flags(train_dir, data_dir):
    return [
        "--train_dir=%s" % train_dir,
        "--data_dir=%s" % data_dir,
        "--model=resnet8",
        "--num_towers=2",
        "--device_type=cpu",
        "--global_batch_size=16",
        "--max_steps=%d" % MAX_STEPS,
        "--save_checkpoint_steps=4",
        "--log_every_n_steps=4",
        "--ema_decay=0.9",
        "--seed=7",
    ]


def tiny_config(train_dir, data_dir, **overrides):
    settings = dict(
        train_dir=train_dir,
        data_dir=data_dir,
        model="resnet8",
        num_towers=2,
        device_type="cpu",
        global_batch_size=16,
        max_steps=12,
        save_checkpoint_steps=4,
        log_every_n_steps=4,
        ema_decay=0.9,
        seed=7,
    )
    settings.update(overrides)
    return settings  # the train flags given


def model_values(prefix):
    """{name: value} of every tensor of a checkpoint but the data position (a variant,
    which NumPy cannot hold; it is what makes the values equal, not what is compared)."""
    reader = tf.train.load_checkpoint(prefix)
    dtypes = reader.get_variable_to_dtype_map()
    return {n: reader.get_tensor(n) for n, dtype in dtypes.items() if dtype != tf.variant}


def assert_bit_identical(actual_prefix, expected_prefix):
    actual, expected = model_values(actual_prefix), model_values(expected_prefix)
    assert sorted(actual) == sorted(expected)
    kinds = ("Momentum", "moving_mean", "moving_variance", "ExponentialMovingAverage")
    for kind in kinds:  # slots, batch-norm statistics and the weights' EMA are compared
        assert any(kind in name for name in expected), kind
    assert int(actual["global_step"]) == int(expected["global_step"])
    for name in expected:
        np.testing.assert_array_equal(actual[name], expected[name], err_msg=name)


def test_sigkill_at_five_random_moments_then_resume_is_bit_identical(
    pool, tmp_path, tiny_data
):
    reference_dir = str(tmp_path / "reference")
    reference = pool.start(TRAIN_SCRIPT, _flags(reference_dir, tiny_data))
    killed_dir = str(tmp_path / "killed")
    history = runner.kill_at_random_moments(pool, TRAIN_SCRIPT, _flags(killed_dir, tiny_data),
                                            KILLS, (0.0, 1.2), TIMEOUT, seed=os.getpid())
    print("kills (delay, exit code):", history)
    final = pool.start(TRAIN_SCRIPT, _flags(killed_dir, tiny_data))
    assert final.wait(TIMEOUT) == 0, final.output[-3000:]
    assert reference.wait(TIMEOUT) == 0, reference.output[-3000:]
    # At least some kills landed in training (not all after the end).
    assert sum(code == -signal.SIGKILL for _, code in history) >= 3, history
    last = "model.ckpt-%d" % MAX_STEPS
    assert_bit_identical(
        os.path.join(killed_dir, last), os.path.join(reference_dir, last)
    )


def test_two_uninterrupted_runs_with_one_seed_are_bit_identical(tmp_path, tiny_data):
    first = job.train(tiny_config(str(tmp_path / "first"), tiny_data))
    second = job.train(tiny_config(str(tmp_path / "second"), tiny_data))
    assert first.global_step == second.global_step == 12
    assert_bit_identical(
        str(tmp_path / "second" / "model.ckpt-12"), str(tmp_path / "first" / "model.ckpt-12")
    )
    other = job.train(tiny_config(str(tmp_path / "other"), tiny_data, seed=8))
    assert other.loss != first.loss  # the seed matters

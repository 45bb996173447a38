"""The CIFAR-10 train script's and the large-batch recipe's own flags that ended in a
traceback with status 1: each is one line naming the flag and the fix, status 2, before
anything is written."""

import os
import subprocess
import sys

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow  # a fresh process per case (TensorFlow loads before these checks)
@pytest.mark.parametrize("script, flag, expected", [
    ("cifar10.train", "--seed=-1",
     "error: --seed=-1: the seed must be an integer in 0..4294967295. Fix: "),
    ("cifar10.train", "--seed=9223372036854775808",
     "error: --seed=9223372036854775808: the seed must be "),
    ("cifar10.train", "--lr_decay_epochs=5,5", "error: --lr_decay_epochs=5,5: "
     "learning-rate decay epochs must be positive and strictly ascending"),
    ("large_batch_recipe", "--seed=-1", "error: --seed=-1: give an integer in "
     "0..4294967295"),
    ("large_batch_recipe", "--train_dir={file}", "error: --train_dir={file} is a file: "
     "give a new folder"),
])
def test_a_wrong_flag_is_one_line_and_status_2(tmp_path, script, flag, expected):
    a_file = tmp_path / "a_file"
    a_file.write_text("mine")
    flag, expected = flag.format(file=a_file), expected.format(file=a_file)
    train_dir = f"--train_dir={tmp_path / 'run'}"
    completed = subprocess.run(
        [sys.executable, "-m", "examples." + script] +
        ([flag] if "train_dir" in flag else [train_dir, flag]),
        cwd=REPO_ROOT, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
        capture_output=True, text=True, timeout=300)
    assert completed.returncode == 2, completed.stderr[-3000:]
    assert "Traceback" not in completed.stderr, completed.stderr[-3000:]
    errors = [line for line in completed.stderr.splitlines() if line.startswith("error")]
    assert len(errors) == 1 and errors[0].startswith(expected), completed.stderr[-3000:]
    assert not (tmp_path / "run").exists() and a_file.read_text() == "mine"

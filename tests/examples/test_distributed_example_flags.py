"""examples/distributed/train.py's flags: a wrong one is one line and status 2, before
TensorFlow loads; --exit_host_lost_at ends a task with status 69 after the step it names,
the documented way to try a lost host."""

import os
import subprocess
import sys

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = "examples/distributed/train.py"


def run(*flags, timeout=60):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    return subprocess.run([sys.executable, SCRIPT, *flags], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("flag, words", [
    ("--learning_rate=-0.5", "the learning rate must be a finite number > 0"),
    ("--learning_rate=nan", "the learning rate must be a finite number > 0"),
    ("--seed=-1", "the seed must be an integer in 0..4294967295"),
    ("--seed=9223372036854775808", "the seed must be an integer in 0..4294967295"),
    ("--exit_host_lost_at=1", "give WORKER:STEP"),
    ("--exit_host_lost_at=1:0", "give WORKER:STEP"),
])
def test_a_wrong_flag_is_one_line_and_status_2(tmp_path, flag, words):
    completed = run(flag, f"--train_dir={tmp_path / 'run'}", "--max_steps=2")
    assert completed.returncode == 2, completed.stderr[-3000:]
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: flag {flag}: {words}"), lines
    assert "Fix: " in lines[0] or "e.g." in lines[0]
    assert not (tmp_path / "run").exists()   # refused before anything ran


@pytest.mark.slow   # TensorFlow in a fresh process, twice
def test_exit_host_lost_at_ends_the_task_with_69_after_its_step(tmp_path):
    flags = ["--max_steps=4", "--num_towers=1", "--save_checkpoint_steps=1",
             f"--train_dir={tmp_path}"]
    completed = run("--exit_host_lost_at=0:2", *flags, timeout=240)
    assert completed.returncode == 69, completed.stderr[-3000:]
    assert completed.stdout.strip().splitlines()[-1] == (
        "one machine: exiting 69 after step 2 (--exit_host_lost_at=0:2), as a task whose "
        "host is lost: nothing saved."), completed.stdout[-2000:]
    assert "step 2, loss = " in completed.stderr and "step 3, loss" not in completed.stderr
    # Resumed past the step it names (from step 1 or 2), a task goes on to the end.
    completed = run("--exit_host_lost_at=0:1", *flags, timeout=240)
    assert completed.returncode == 0 and "finished: global_step=4" in completed.stdout, \
        completed.stderr[-3000:]

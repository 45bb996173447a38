"""examples/large_batch_recipe.py runs the recipe and sums it up in one true line."""

import os
import pathlib
import re
import subprocess
import sys

import pytest
import tensorflow as tf

from tests import helpers

ROOT = pathlib.Path(__file__).resolve().parents[2]
SUMMARY = re.compile(r"^large-batch recipe: best precision ([0-9.]+) at step (\d+); "
                     r"stopped (early )?at step (\d+) of (\d+); final training loss "
                     r"([0-9.]+)", re.MULTILINE)


def run_recipe(*flags, timeout=240):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=helpers.python_path(ROOT))
    return subprocess.run([sys.executable, "-m", "examples.large_batch_recipe", *flags],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_recipe_summary_gives_the_best_evaluation_its_step_and_the_stop(tmp_path):
    train_dir = tmp_path / "run"
    run = run_recipe("--global_batch=16", "--max_steps=6", "--eval_every=2",
                     f"--train_dir={train_dir}")

    assert run.returncode == 0, run.stderr[-3000:]
    (line,) = SUMMARY.findall(run.stdout)
    best, best_step, early, stop_step, max_steps, loss = line
    assert 0.0 <= float(best) <= 1.0 and int(max_steps) == 6
    assert int(best_step) in (2, 4, 6) and int(best_step) <= int(stop_step) <= 6
    assert (int(stop_step) < 6) == bool(early)
    assert float(loss) > 0.0
    # The evaluations the log shows agree with the line: the best one is the one named.
    evaluations = {int(step): float(value) for step, value in re.findall(
        r"step (\d+): evaluation precision ([0-9.]+)", run.stderr)}
    assert max(evaluations.values()) == pytest.approx(float(best), abs=1e-3)
    assert evaluations[int(best_step)] == pytest.approx(float(best), abs=1e-3)
    # The best checkpoint holds the weights of the best step.
    best_checkpoint = tf.train.latest_checkpoint(str(train_dir / "best"))
    assert best_checkpoint and best_checkpoint.endswith(f"-{best_step}")


@pytest.mark.slow
@pytest.mark.parametrize("flag, named", [("--eval_every=9", "--eval_every=9"),
                                         ("--no_such_flag=1", "no_such_flag"),
                                         ("--model=resnet9", "--model=resnet9")])
def test_a_bad_flag_is_one_line_and_exit_status_2(tmp_path, flag, named):
    run = run_recipe("--max_steps=8", f"--train_dir={tmp_path / 'run'}", flag, timeout=120)

    assert run.returncode == 2, run.stderr[-2000:]
    lines = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and named in lines[0], run.stderr[-2000:]
    assert "Traceback" not in run.stderr and not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_folder_holding_a_run_is_refused_not_found_done(tmp_path):
    (tmp_path / "checkpoint").write_text("model_checkpoint_path: \"model.ckpt-320\"\n")

    run = run_recipe(f"--train_dir={tmp_path}", timeout=120)

    assert run.returncode == 2 and "is not empty" in run.stderr, run.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]


@pytest.mark.slow
def test_without_train_dir_it_says_where_its_temporary_folder_is(tmp_path):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=helpers.python_path(ROOT),
               TMPDIR=str(tmp_path))
    run = subprocess.run([sys.executable, "-m", "examples.large_batch_recipe",
                          "--max_steps=2", "--eval_every=2"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    (folder,) = [p for p in tmp_path.iterdir() if p.name.startswith("large_batch_recipe_")]
    assert f"train_dir: {folder} (a new temporary folder" in run.stdout

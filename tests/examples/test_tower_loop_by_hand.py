"""The lesson's tower loop by hand and towerlib train the same model to the same values."""

import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from examples import tower_loop_by_hand as lesson
from tests import helpers

MOVING = ("bn1/moving_mean", "bn1/moving_variance", "bn2/moving_mean", "bn2/moving_variance")


def test_first_tower_loop_by_hand_ends_where_towerlib_first_tower_does():
    initial = lesson.train(lesson.train_op_by_hand, steps=0)
    by_hand = lesson.train(lesson.train_op_by_hand, steps=5)
    with_towerlib = lesson.train(lesson.train_op_with_towerlib, steps=5, bn_mode="first_tower")

    assert sorted(by_hand) == sorted(with_towerlib) == sorted(initial)
    assert set(MOVING) < set(by_hand) and len(by_hand) == 11
    for name, value in by_hand.items():
        np.testing.assert_allclose(with_towerlib[name], value, rtol=0, atol=1e-5, err_msg=name)
        # Both builds start from the same values, and five steps move every one of them.
        assert np.max(np.abs(value - initial[name])) > 1e-3, name


def test_all_towers_by_hand_takes_one_moving_step_per_shard_towerlib_one_per_batch():
    """By hand, running every tower's UPDATE_OPS moves the moving mean once per shard
    (racing, from the same start or one after another); towerlib's all_towers moves it
    once, by the whole batch's mean. The weights do not depend on it and stay equal."""
    num_towers, global_batch, decay = 2, 32, lesson.MOMENTUM
    initial = lesson.train(lesson.train_op_by_hand, steps=0)
    by_hand = lesson.train(lesson.train_op_by_hand, steps=1, bn_updates="all_towers")
    with_towerlib = lesson.train(lesson.train_op_with_towerlib, steps=1, bn_mode="all_towers")

    images = lesson.labelled_images()[0][:global_batch]
    conv1 = tf.nn.conv2d(images, initial["conv1/weights"], 1, "SAME").numpy()
    shard_means = [shard.mean(axis=(0, 1, 2)) for shard in np.split(conv1, num_towers)]
    np.testing.assert_allclose(  # one step from 0 by the global batch's mean
        with_towerlib["bn1/moving_mean"], (1 - decay) * conv1.mean(axis=(0, 1, 2)),
        rtol=0, atol=1e-6)
    # N steps from 0, one per shard: (1 - d) * sum_k d^(N-1-k) m_k one after another,
    # (1 - d) * sum_k m_k when both read the start value; within the gap of the two.
    racing = (1 - decay) * np.sum(shard_means, axis=0)
    gap = (1 - decay) * (1 - decay ** (num_towers - 1)) * np.sum(np.abs(shard_means), axis=0)
    assert np.all(np.abs(by_hand["bn1/moving_mean"] - racing) <= gap + 1e-6)
    assert not np.allclose(by_hand["bn1/moving_mean"], with_towerlib["bn1/moving_mean"],
                           rtol=0.2, atol=0)
    for name in by_hand:
        if name not in MOVING:
            np.testing.assert_allclose(with_towerlib[name], by_hand[name], rtol=0, atol=1e-5)


def test_the_lesson_page_shows_the_example_file_as_it_is():
    root = pathlib.Path(__file__).resolve().parents[2]
    page = (root / "docs" / "tower_loop.md").read_text()
    source = (root / "examples" / "tower_loop_by_hand.py").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, re.S)
    assert len(blocks) >= 4
    assert [block for block in blocks if block not in source] == []


@pytest.mark.slow  # trains four times in a fresh process
def test_the_lesson_runs_as_the_page_shows():
    root = pathlib.Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "-m", "examples.tower_loop_by_hand"], cwd=root, capture_output=True,
        text=True, timeout=300, env={"PYTHONPATH": helpers.python_path(root),
                                     "TF_CPP_MIN_LOG_LEVEL": "2", "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr[-3000:]
    first, all_towers = result.stdout.splitlines()[-2:]
    assert first.startswith("first tower: 11 variables, largest difference ")
    assert float(first.rsplit(" ", 1)[1]) < 1e-5
    ratio = float(all_towers.split("moved ")[1].split("x as far")[0])
    assert 1.8 < ratio < 2.2  # two updates a step by hand, one through towerlib


@pytest.mark.slow  # trains four times in a fresh process
def test_the_lesson_honours_its_flags():
    root = pathlib.Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "-m", "examples.tower_loop_by_hand", "--num_towers=4", "--steps=1"],
        cwd=root, capture_output=True, text=True, timeout=300,
        env={"PYTHONPATH": helpers.python_path(root), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr[-3000:]
    # No TensorFlow start-up lines before the result (TF_CPP_MIN_LOG_LEVEL left unset).
    startup = [line for line in result.stderr.splitlines()
               if "cuInit" in line or "oneDNN custom operations" in line
               or "cuda drivers" in line or "rebuild TensorFlow" in line]
    assert startup == [], startup
    ran, first, all_towers = result.stdout.splitlines()[-3:]
    assert ran == "4 towers, 1 step(s) of 32 examples each way"
    assert float(first.rsplit(" ", 1)[1]) < 1e-5
    ratio = float(all_towers.split("moved ")[1].split("x as far")[0])
    assert 3.6 < ratio < 4.4 and "(4 updates a step" in all_towers, all_towers


@pytest.mark.parametrize("argv, words", [
    (["--num_towers=3"], "--global_batch=32 does not split into --num_towers=3 equal"),
    (["--steps=0"], "each must be at least 1"),
    (["--num_towers=x"], "argument --num_towers: invalid int value: 'x'"),
])
def test_a_wrong_flag_of_the_lesson_is_one_line_and_status_2(capsys, argv, words):
    with pytest.raises(SystemExit) as ended:
        lesson.parse_flags(argv)
    assert ended.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: ") and words in line, line

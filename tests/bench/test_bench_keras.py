"""bench/bench_keras.py keeps running: a tiny run prints both models and the target line."""

import os
import pathlib
import subprocess
import sys

import pytest

from tests import helpers

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.slow  # a fresh Python that builds two ResNets
def test_a_tiny_keras_benchmark_run_prints_both_models_and_the_verdict():
    env = dict(os.environ, PYTHONPATH=helpers.python_path(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    result = subprocess.run(
        [sys.executable, "bench/bench_keras.py", "--towers=4", "--models=resnet8,keras_resnet8",
         "--global_batch=8", "--warmup_steps=1", "--repetitions=2",
         "--steps_per_repetition=1"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=400, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line for line in result.stdout.splitlines() if line.startswith("| 4 |")]
    assert [row.split("|")[2].strip() for row in rows] == ["resnet8", "keras_resnet8"]
    assert "target keras_resnet20 / resnet20 step time <= 1.05x at 4 towers" in result.stdout

"""bench/bench_global_batches.py runs and prints its ratios (smoke test, tiny sizes)."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow  # a fresh process, both inputs built and timed
def test_global_batches_benchmark_prints_its_ratios():
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "bench_global_batches.py"),
         "--train_records=200", "--global_batch=8", "--warm_batches=3",
         "--repetitions=1", "--steps=2", "--notrain_steps"],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert result.returncode == 0, result.stderr[-3000:]
    ratios = re.search(r"ratio global/shuffled: state bytes (\S+), save time", result.stdout)
    assert ratios, result.stdout
    # Four numbers against a shuffle buffer of 100 images: far smaller.
    assert float(ratios.group(1).rstrip(",")) < 0.1, result.stdout

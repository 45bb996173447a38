"""bench/bench_precision_memory.py runs and prints its ratios (smoke test, tiny sizes)."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow  # fresh processes, two graphs timed
def test_precision_memory_benchmark_prints_its_ratios():
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "bench_precision_memory.py"),
         "--repetitions=1", "--steps=1", "--global_batch=16", "--speed_repetitions=2",
         "--speed_batch=4", "--model=convnet"],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.search(r"step memory, k = 4 / one batch: \d+\.\d\dx", result.stdout)
    assert re.search(r"bfloat16 / float32 step time .*: \d+\.\d\dx", result.stdout)

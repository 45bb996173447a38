"""bench/bench_record_input.py runs and prints its ratios (smoke test, tiny sizes)."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow  # fresh processes, both inputs built and timed
def test_record_input_benchmark_prints_its_ratios():
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "bench_record_input.py"),
         "--records=80", "--image_size=32", "--batch=4", "--batches=2", "--repetitions=1"],
        capture_output=True, text=True, timeout=900, cwd=ROOT,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert result.returncode == 0, result.stderr[-3000:]
    for decode in ("False", "True"):
        assert re.search(rf"decode_jpeg={decode}: .* ratio indexed/stream \d", result.stdout)
    assert re.search(r"index build: .* s/GB", result.stdout), result.stdout
    assert re.search(r"peak RSS: .* ratio 4x/1x \d", result.stdout), result.stdout

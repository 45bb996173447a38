"""bench/bench_trace.py keeps running: a tiny run prints both ratios
(a traced step over an untraced one; run_training with trace_steps never reached
over run_training without) with their middle halves, the A/A control and the
verdict. Its numbers mean nothing here (2 repetitions of 1 step of a tiny batch)."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

from tests import helpers

ROOT = pathlib.Path(__file__).resolve().parents[2]
NUMBER = r"(\d+\.\d+)"


def _cells(stdout, label_start):
    (line,) = [line for line in stdout.splitlines() if line.startswith("| " + label_start)]
    return [cell.strip() for cell in line.strip("|").split("|")]


@pytest.mark.slow  # builds four graphs and starts three run_training loops (~12 s)
def test_trace_benchmark_prints_both_ratios_with_their_middle_half():
    env = dict(os.environ, PYTHONPATH=helpers.python_path(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    result = subprocess.run(
        [sys.executable, "bench/bench_trace.py", "--towers=2", "--model=convnet",
         "--global_batch=8", "--warmup_steps=1", "--repetitions=2",
         "--trace_steps_per_repetition=1", "--loop_steps_per_repetition=1"],
        check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    header = _cells(result.stdout, "ratio |")
    for label in ("traced / untraced step", "run_training with trace_steps=[never reached]",
                  "control: run_training without"):
        row = dict(zip(header, _cells(result.stdout, label)))
        assert float(row["numerator s/step"]) > 0 and float(row["denominator s/step"]) > 0
        assert 0 < float(row["ratio of medians"].rstrip("x")) < 100
        low, median, high = (float(v) for v in re.fullmatch(
            rf"{NUMBER} \({NUMBER}-{NUMBER}\)",
            row["paired ratio: median (middle half)"]).group(2, 1, 3))
        assert 0 < low <= median <= high
        assert row["repetitions"] == "2"
    assert re.search(r"^analyze_step: median [\d.]+ ms per traced step", result.stdout, re.M)
    assert re.search(r"^target loop with an unreached TraceHook / without, step time "
                     r"<= 1\.00x .*: [\d.]+x, (met|MISSED)$", result.stdout, re.M)

"""bench/bench_sharded_update.py keeps running: a tiny model, one repetition, a report
line with the ratios; and the sharded process holds fewer slot bytes per tower."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

from tests import helpers

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.parametrize("workers, towers, slot_share", [
    (1, 4, (0.2, 0.3)),    # 4 equal layers over 4 towers, and a head
    (2, 2, (0.2, 0.3)),    # over the 4 towers of both workers
    (2, 1, (0.45, 0.55)),  # 1 tower per worker: each worker holds half the slots
])
def test_a_tiny_run_reports_every_ratio(workers, towers, slot_share):
    env = dict(os.environ, PYTHONPATH=helpers.python_path(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run(
        [sys.executable, "bench/bench_sharded_update.py", "--repetitions=1", "--width=64",
         "--depth=4", "--warmup=1", "--steps=1", f"--workers={workers}", f"--towers={towers}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    line = done.stdout.strip().splitlines()[-1]
    ratios = re.match(r"sharded / unsharded: step time ([\d.]+), peak RSS ([\d.]+) \(after "
                      r"the start ([\d.]+)\), slots per tower ([\d.]+) "
                      rf"\({workers} x {towers} towers", line)
    assert ratios, line
    assert all(float(ratio) > 0 for ratio in ratios.groups()[:3]), line
    low, high = slot_share
    assert low <= float(ratios.group(4)) <= high, line

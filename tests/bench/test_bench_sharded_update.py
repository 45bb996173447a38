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


@pytest.mark.slow
def test_across_workers_the_sharded_step_moves_half_again_the_gradients_bytes():
    """Counted from the built graph of worker 0 of 2 x 1 tower (ResNet-50's weights):
    unsharded, a ring all-reduce of the gradients (1 x S for 2 members); sharded, that
    and an all-gather of the owners' new weights (0.5 x S)."""
    sys.path.insert(0, str(ROOT))
    import towerlib
    from bench import bench_sharded_update as bench

    unsharded, weights = bench.busiest_device_bytes(1, towerlib.Replicated(), None, 2)
    sharded, _ = bench.busiest_device_bytes(
        1, towerlib.Replicated(shard_update=True), None, 2)
    assert abs(unsharded / weights - 1.0) < 0.01, unsharded / weights
    assert abs(sharded / unsharded - 1.5) < 0.01, sharded / unsharded

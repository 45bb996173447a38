"""bench/bench_variable_update.py keeps running: a tiny run prints every variant, its
ratios, and the transport comparison that decides the replicated default on CPU towers.
Its numbers mean nothing here (1 repetition of 1 step of a tiny batch)."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

from tests import helpers

ROOT = pathlib.Path(__file__).resolve().parents[2]
VARIANTS = ["parameter_server", "replicated/graph", "replicated/graph/unpacked",
            "replicated/collective"]


@pytest.mark.slow  # runs bench/bench_variable_update.py in a fresh process (~15 s)
def test_variable_update_benchmark_prints_every_variant_and_the_transport():
    env = dict(os.environ, PYTHONPATH=helpers.python_path(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    result = subprocess.run(
        [sys.executable, "bench/bench_variable_update.py", "--towers=2",
         "--transport_towers=2", "--model=convnet", "--global_batch=8", "--warmup_steps=1",
         "--repetitions=1", "--steps_per_repetition=1"],
        check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    header = [c.strip() for c in
              next(line for line in lines if line.startswith("| towers |")).strip("|").split("|")]
    rows = {}
    for line in lines:
        if line.startswith("| 2 |"):
            cells = dict(zip(header, (c.strip() for c in line.strip("|").split("|"))))
            rows[cells["variant"]] = cells
    assert list(rows) == VARIANTS, result.stdout
    for variant, cells in rows.items():
        assert float(cells["s/step"]) > 0
        assert 0 < float(cells["/ parameter_server"].rstrip("x")) < 100
    # Only the collective transport's graph has collective ops.
    assert int(rows["replicated/collective"]["collective ops"]) > 0
    assert int(rows["replicated/graph"]["collective ops"]) == 0
    transport = lines[lines.index(next(line for line in lines
                                       if line.startswith("TRANSPORT"))) + 1]
    assert re.fullmatch(r"  2 towers: collective / graph step time, per repetition: "
                        r"[\d.]+ -> (graph|collective) is faster", transport), transport

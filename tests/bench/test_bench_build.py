"""bench/bench_build.py: the build-cost table, from made-up results and from a tiny run.

The tables are checked on made-up measurements (no TensorFlow, fast); the
smoke run builds the convnet in fresh processes at 1 and 2 towers (slow:
each process imports TensorFlow) and stops one configuration at a tiny
time limit.
"""

import os
import pathlib
import subprocess
import sys

import pytest

from bench import bench_build
from bench.bench_build import Config, Result
from tests import helpers

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _result(update, towers, k, build, nodes, status="ok"):
    values = {"build_seconds": build, "build_cpu_seconds": build, "graph_def_mb": nodes / 1000,
              "nodes": nodes, "first_step_seconds": build / 2, "peak_rss_gb": 1.0}
    return Result(Config(update, towers, k), status, values)


def test_handwritten_runs_at_k_1_only():
    configs = bench_build.configurations([1, 8], [1, 4], list(bench_build.UPDATES))
    labels = [c.label for c in configs]
    assert labels == ["parameter_server x1 k=1", "parameter_server x1 k=4",
                      "parameter_server x8 k=1", "parameter_server x8 k=4",
                      "replicated x1 k=1", "replicated x1 k=4",
                      "replicated x8 k=1", "replicated x8 k=4",
                      "handwritten x1 k=1", "handwritten x8 k=1"]


def test_ratios_to_the_one_tower_row_and_to_the_parameter_server():
    results = [_result("parameter_server", 1, 1, 2.0, 1000),
               _result("parameter_server", 8, 1, 16.0, 8000),
               _result("replicated", 1, 1, 2.0, 1000),
               _result("replicated", 8, 1, 24.0, 12000),
               Result(Config("replicated", 8, 4), bench_build.OVER_LIMIT,
                      reason="still running after 60 s")]
    text = bench_build.render(results, "resnet50_sized", 128)
    table, comparison = text.split("Ratios to the parameter server")
    rows = {" ".join(cell.strip("| ") for cell in line.split(" | ")[:3]): line
            for line in table.splitlines() if line.startswith("| ")}
    # update | towers | k | build s | x1 | build CPU s | x1 | ... | nodes | x1
    assert "| 16.0 | 8.00 |" in rows["parameter_server 8 1"]
    assert "| 12,000 | 12.00 |" in rows["replicated 8 1"]
    assert "| over limit | - |" in rows["replicated 8 4"]
    assert "| replicated | 8 | 1 | 1.50 | 1.50 | 1.50 | 1.50 | 1.50 | 1.00 |" in comparison
    assert "replicated x8 k=4: over limit: still running after 60 s" in text


def test_interleaved_rounds_are_combined_by_their_medians():
    rounds = [_result("parameter_server", 8, 64, build, nodes=5000) for build in (9.0, 3.0, 4.0)]
    combined = bench_build.median_result(rounds)
    assert combined.status == "ok"
    assert combined.values["build_cpu_seconds"] == 4.0 and combined.values["nodes"] == 5000
    assert bench_build.median_result(rounds[:2]).values["build_seconds"] == 6.0
    stopped = Result(Config("parameter_server", 8, 64), bench_build.OVER_LIMIT, {},
                     reason="still running")
    assert bench_build.median_result([rounds[0], stopped]).status == bench_build.OVER_LIMIT


def test_a_batch_too_small_for_the_micro_batches_is_not_run():
    result = bench_build.run_config(Config("replicated", 8, 64), model="convnet",
                                    global_batch=128, first_step=True, time_limit=1)
    assert result.status == bench_build.NOT_APPLICABLE
    assert result.values == {}


def _run(*args, timeout=120):
    env = dict(os.environ, PYTHONPATH=helpers.python_path(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    result = subprocess.run([sys.executable, "-m", "bench.bench_build", *args], cwd=ROOT,
                            env=env, capture_output=True, text=True, timeout=timeout,
                            check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


@pytest.mark.slow  # three fresh processes that import TensorFlow
def test_a_tiny_run_prints_the_table():
    out = _run("--model=convnet", "--towers=2", "--k=1", "--global_batch=8",
               "--updates=parameter_server,replicated,handwritten")
    lines = [line for line in out.splitlines() if line.startswith("| ")]
    rows = [line.split(" | ") for line in lines if line.split(" | ")[1:2] == ["2"]]
    assert [row[0].strip("| ") for row in rows] == [
        "parameter_server", "replicated", "handwritten", "replicated", "handwritten"]
    for row in rows[:3]:  # the measurements: every one there, positive
        build, cpu, megabytes, nodes, step, rss = row[3:15:2]
        assert float(build) > 0 and float(cpu) > 0 and float(megabytes) > 0
        assert int(nodes.replace(",", "")) > 100 and float(step) > 0 and float(rss) > 0.1
    for row in rows[3:]:  # the ratios to the parameter server
        assert all(float(cell.strip(" |")) > 0 for cell in row[3:])


@pytest.mark.slow  # a process stopped while it imports TensorFlow
def test_a_configuration_over_the_time_limit_does_not_hang():
    out = _run("--model=convnet", "--towers=1,2", "--k=1", "--global_batch=1",
               "--updates=parameter_server", "--time_limit=0.5", timeout=60)
    assert "| parameter_server | 1 | 1 | over limit |" in out
    assert "| parameter_server | 2 | 1 | n/a |" in out
    assert "parameter_server x1 k=1: over limit: still running after 0.5 s" in out

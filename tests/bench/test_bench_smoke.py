"""The benchmark keeps running: a smoke run produces the report with every configuration.

The smoke run (`python -m bench.run --smoke`) trains each configuration of one
group (the convnet on 2 virtual CPU towers) for a couple of tiny steps; its
numbers mean nothing, but every one of them must be there, positive and finite.
The full benchmark stays out of CI. The statistics and the target verdicts are
checked on made-up values, without TensorFlow.
"""

import json
import math
import os
import pathlib
import re
import subprocess
import sys

import pytest

from bench import configs, coordinator, measure, report, run_results, targets
from tests import helpers

ROOT = pathlib.Path(__file__).resolve().parents[2]
SMOKE_TOWERS = 2
SMOKE_MODEL = "convnet"

# Only bn_mode='sync' may be missing (it arrives with its own issue); everything
# else must run.
MAY_BE_UNAVAILABLE = {(configs.TOWERLIB, "sync")}


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench_smoke")
    markdown, raw = out / "BENCHMARKS.md", out / "results.json"
    env = dict(os.environ, PYTHONPATH=helpers.python_path(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    result = subprocess.run(
        [sys.executable, "-m", "bench.run", "--smoke", f"--models={SMOKE_MODEL}",
         f"--towers={SMOKE_TOWERS}", f"--output={markdown}", f"--json_output={raw}",
         f"--worker_log_dir={out / 'logs'}"],
        check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return markdown.read_text(), json.loads(raw.read_text())


def _expected_configs():
    return configs.group_configs(SMOKE_MODEL, SMOKE_TOWERS, ["first_tower", "all_towers", "sync"],
                                 configs.PEERS)


@pytest.mark.slow  # reads the benchmark's smoke run
def test_every_configuration_ran(smoke_run):
    _, raw = smoke_run
    by_key = {r["config"]["kind"] + "/" + str(r["config"]["bn_mode"]) + "/" +
              r["config"]["input_source"]: r for r in raw["results"]}
    for config in _expected_configs():
        key = f"{config.kind}/{config.bn_mode}/{config.input_source}"
        assert key in by_key, f"{config.label} missing from the results"
        result = by_key[key]
        if (config.kind, config.bn_mode) in MAY_BE_UNAVAILABLE:
            assert result["status"] in ("ok", "unavailable"), result["reason"]
        else:
            assert result["status"] == "ok", f"{config.label}: {result['reason']}"


@pytest.mark.slow  # reads the benchmark's smoke run
def test_numbers_are_positive_and_finite(smoke_run):
    _, raw = smoke_run
    ok = [r for r in raw["results"] if r["status"] == "ok"]
    assert ok
    for result in ok:
        label = result["label"]
        for field in ("step_seconds", "step_cpu_seconds", "build_seconds"):
            assert result[field], (label, field)
            assert all(measure.is_positive_finite(v) for v in result[field]), (label, field)
        for field in ("first_step_seconds", "peak_rss_mb", "baseline_rss_mb",
                      "initial_checksum", "final_checksum"):
            assert measure.is_positive_finite(result[field]), (label, field, result[field])


@pytest.mark.slow  # reads the benchmark's smoke run
def test_same_initial_weights_everywhere(smoke_run):
    _, raw = smoke_run
    checksums = {r["initial_checksum"] for r in raw["results"] if r["status"] == "ok"}
    assert len(checksums) == 1, checksums


@pytest.mark.slow  # reads the benchmark's smoke run
def test_mirrored_step_is_not_retraced(smoke_run):
    _, raw = smoke_run
    (mirrored,) = [r for r in raw["results"] if r["config"]["kind"] == configs.MIRRORED]
    at_ready, at_finish = mirrored["trace_count"]
    assert at_finish == at_ready


@pytest.mark.slow  # reads the benchmark's smoke run
def test_report_has_every_configuration_and_the_machine(smoke_run):
    markdown, raw = smoke_run
    for config in _expected_configs():
        assert f"| {config.label} |" in markdown, config.label
    for heading in ("## Targets", "### Images/sec", "### Ratios", "### Graph construction",
                    "### Peak memory", "### Same weights"):
        assert heading in markdown, heading
    assert "python -m bench.run --smoke" in markdown
    assert "TensorFlow " + raw["meta"]["tf_version"] in markdown
    assert "load average" in markdown
    assert "Smoke run" in markdown
    assert not re.search(r"\b(nan|inf)\b", markdown.lower())


# --- statistics and verdicts, on made-up numbers -------------------------------------------


def test_paired_ratios_skip_missing_repetitions():
    assert measure.paired_ratios([1.0, None, 3.0], [2.0, 2.0, None]) == [0.5]
    summary = measure.ratio_summary([1.0, 2.0, 4.0], [1.0, 1.0, 1.0])
    assert (summary.median, summary.low, summary.high) == (2.0, 1.0, 4.0)
    assert math.isclose(summary.spread, 1.5)


def test_linear_fit_recovers_a_line():
    slope, intercept, r2 = measure.linear_fit([1, 2, 4, 8], [1.5, 2.0, 3.0, 5.0])
    assert math.isclose(slope, 0.5) and math.isclose(intercept, 1.0) and math.isclose(r2, 1.0)


def _result(kind, bn_mode, towers, step_seconds):
    config = configs.BenchConfig(kind, "m", towers, bn_mode=bn_mode)
    return coordinator.ConfigResult(config, step_seconds=step_seconds,
                                    step_cpu_seconds=step_seconds)


def test_report_marks_a_missed_target():
    results = [
        _result(configs.TOWERLIB, "first_tower", 8, [1.10, 1.12, 1.11]),
        _result(configs.HANDWRITTEN, None, 8, [1.00, 1.00, 1.00]),
        _result(configs.MIRRORED, None, 8, [2.0, 2.0, 2.0]),
        _result(configs.SINGLE_DEVICE, None, 8, [1.0, 1.0, 1.0]),
    ]
    run = run_results.RunResults(results, global_batch=128)
    handwritten_target = targets.TARGETS[0]
    ratio = run.ratio("m", 8, handwritten_target.numerator, handwritten_target.denominator,
                      handwritten_target.quantity)
    assert math.isclose(ratio.median, 1.11) and not handwritten_target.met(ratio.median)
    mirrored = run.ratio("m", 8, targets.TOWERLIB_FIRST, targets.MIRRORED, "throughput")
    assert math.isclose(mirrored.median, 2.0 / 1.11)
    summary = "\n".join(report._targets_summary(run))
    assert report.CROSS in summary and report.CHECK in summary


@pytest.mark.slow  # runs bench/bench_bn_modes.py in a fresh process
def test_bn_mode_benchmark_prints_every_mode_and_ratio():
    """bench/bench_bn_modes.py, the evidence for sync's cost, keeps running."""
    env = dict(os.environ, PYTHONPATH=helpers.python_path(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    result = subprocess.run(
        [sys.executable, "bench/bench_bn_modes.py", "--towers=2", "--model=convnet",
         "--global_batch=8", "--warmup_steps=1", "--repetitions=2", "--steps_per_repetition=1"],
        check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    header = next(line for line in lines if line.startswith("| towers |"))
    rows = [line for line in lines if line.startswith("| 2 |")]
    assert len(rows) == 1, result.stdout
    table = dict(zip((c.strip() for c in header.strip("|").split("|")),
                     (c.strip() for c in rows[0].strip("|").split("|"))))
    modes = ["first_tower", "all_towers", "sync", "sync/collective"]
    assert all(float(table[f"{m} s/step"]) > 0 for m in modes)
    for mode in modes[1:]:
        for column in (f"{mode} / first_tower", f"{mode} / first_tower (CPU time)"):
            assert 0 < float(table[column].rstrip("x")) < 100
        # The paired ratios' median and middle half, 'median (q1-q3)'.
        median, low, high = (float(v) for v in re.fullmatch(
            r"([\d.]+) \(([\d.]+)-([\d.]+)\)",
            table[f"{mode} / first_tower per repetition, median (middle half)"]).groups())
        assert 0 < low <= median <= high
    # Only the collective transport's graph has collective ops.
    assert re.fullmatch(r"sync/collective: [1-9]\d*", table["collective ops per step"])


def test_writing_the_report_again_keeps_the_hand_written_sections(tmp_path):
    path = tmp_path / "BENCHMARKS.md"
    hand_written = report.HAND_WRITTEN_MARKER + "\n\n## Tracing\n\nA table.\n"
    path.write_text("# Old run\n\n" + hand_written)
    report.write_report(str(path), "# New run\n")
    assert path.read_text() == "# New run\n\n" + hand_written
    path.write_text("# A report without hand-written sections\n")
    report.write_report(str(path), "# New run\n")
    assert path.read_text() == "# New run\n"

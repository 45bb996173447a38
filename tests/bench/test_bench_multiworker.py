"""bench/bench_multiworker.py keeps running end to end: a tiny run starts every
configuration's processes on free localhost ports (one process with 4 towers,
towerlib's all-reduce (per-worker hubs and one flat group) and parameter-server
paths across 2 workers,
MultiWorkerMirroredStrategy across 2 workers), checks their losses against each
other, times them and prints a row per configuration. Its numbers mean nothing
here (2 repetitions of 1 step of ResNet-8 on a global batch of 8)."""

import os
import pathlib
import signal
import subprocess
import sys

import pytest

from tests import helpers

ROOT = pathlib.Path(__file__).resolve().parents[2]
ROWS = ["one process, 4 towers",
        "towerlib all-reduce, 2 workers x 2 towers",
        "towerlib all-reduce, 2 x 2, one flat group of 4 members",
        "towerlib parameter server, 1 ps + 2 workers x 2 towers",
        "towerlib all-reduce, 2 workers x 1 tower",
        "towerlib all-reduce graph, plain session loop, 2 x 1",
        "MultiWorkerMirroredStrategy, 2 workers x 1 replica"]
# Every configuration, the opt-in ones included.
CONFIGS = "allreduce_2x2,allreduce_2x2_flat,ps_2x2,allreduce_2x1,plain_2x1,mwms_2x1"
# The benchmark kills its processes at --time_limit; this test kills the
# benchmark (its own process group) a little later.
TIME_LIMIT_SECS = 420


def _processes_left(log_dir):
    """PIDs of the benchmark's processes still alive (they run from its log dir's jobs)."""
    alive = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                text = cmdline.read().decode(errors="replace")
        except OSError:
            continue
        if "bench.multiworker_proc" in text and str(log_dir) in text:
            alive.append(int(pid))
    return alive


@pytest.mark.slow  # starts 12 TensorFlow processes (~2-5 minutes on 2 shared cores)
def test_multiworker_benchmark_checks_losses_and_prints_every_configuration(tmp_path):
    env = dict(os.environ, PYTHONPATH=helpers.python_path(ROOT), TF_CPP_MIN_LOG_LEVEL="3",
               CUDA_VISIBLE_DEVICES="")
    env.pop("TF_CONFIG", None)
    log_dir = tmp_path / "logs"
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.bench_multiworker", "--model=resnet8",
         "--global_batch=8", "--warmup_steps=2", "--repeats=2", "--steps=1",
         "--segment_warmup_steps=0", f"--time_limit={TIME_LIMIT_SECS}", f"--configs={CONFIGS}",
         "--reply_timeout=300", f"--process_log_dir={log_dir}"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=TIME_LIMIT_SECS + 60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        pytest.fail("the benchmark outlived its own time limit:\n" + stdout[-3000:])
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 0, stdout[-3000:] + stderr[-3000:]
    lines = stdout.splitlines()

    checks = [line for line in lines if line.startswith("LOSS CHECK")]
    assert len(checks) == 5, stdout
    assert all("(within 0.0001)" in line for line in checks), checks
    assert any(line.startswith("LOSS CHECK mwms_2x1 vs allreduce_2x1") for line in checks)
    # The plain loop runs the same graph: the same losses.
    assert any(line.startswith("LOSS CHECK plain_2x1 vs allreduce_2x1") for line in checks)
    # 2 x 2 CPU towers add as one process with 4 does: the same bits.
    assert any(line.startswith("LOSS CHECK allreduce_2x2 vs single_4")
               and "= 0.00e+00" in line for line in checks), checks

    header_at = next(i for i, line in enumerate(lines)
                     if line.startswith("| configuration |"))
    header = [c.strip() for c in lines[header_at].strip("|").split("|")]
    rows = {}
    for line in lines[header_at + 2:]:
        if not line.startswith("|"):
            break
        cells = dict(zip(header, (c.strip() for c in line.strip("|").split("|"))))
        rows[cells["configuration"]] = cells
    assert list(rows) == ROWS, stdout
    for cells in rows.values():
        assert float(cells["s/step (median)"]) > 0
        assert 0 < float(cells["/ one process, 4 towers"]) < 100
    assert rows[ROWS[0]]["/ one process, 4 towers"] == "1.000"
    assert any(line.startswith("MultiWorkerMirroredStrategy / towerlib all-reduce (2 x 1)")
               for line in lines), stdout
    assert any(line.startswith("towerlib all-reduce / parameter server (2 x 2)")
               for line in lines), stdout
    assert any(line.startswith("one flat group of 4 / per-worker hubs (2 x 2)")
               for line in lines), stdout
    assert not _processes_left(log_dir)

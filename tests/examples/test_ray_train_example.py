"""examples/ray_train.py, the program docs/distributed.md's Ray Train section shows, runs:
a local Ray cluster on loopback, 2 Ray Train workers of 2 virtual CPU towers each, the
all-reduce to the last step, and nothing of the cluster left afterwards.

The page's snippet is the file's own text, so what a reader copies is what ran here.
Skipped when ray cannot be imported (it is in the test extra, `ray[train]`).
"""

import os
import pathlib
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from tests import helpers
from tests.cluster.ray_serial import one_ray_cluster_at_a_time
from tests.process_table import session_members

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "ray_train.py"
RUN_BUDGET_SECS = 300          # the run takes about 30 s on 2 idle cores
MAX_STEPS = 20


def _ray_section(page):
    text = page.read_text()
    start = text.index("**Ray Train**")
    return text[start:text.index("### Exit statuses", start)]


def test_the_docs_ray_snippet_is_the_example_file_s_text():
    section = _ray_section(ROOT / "docs" / "distributed.md")
    assert "(../examples/ray_train.py)" in section
    assert "pip install -e '.[ray]'" in section       # from a clone
    python_blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert python_blocks, section
    source = EXAMPLE.read_text()
    for block in python_blocks:
        assert block in source, "the snippet is not examples/ray_train.py's text"
    shown = "".join(python_blocks)
    assert "def train_loop(config):" in shown and "TensorflowTrainer(" in shown


@pytest.mark.slow  # a Ray cluster and two Ray Train workers
@pytest.mark.one_ray_cluster
def test_the_ray_train_example_runs_on_loopback(tmp_path):
    pytest.importorskip(
        "ray", reason="ray cannot be imported: pip install -e '.[test]' brings ray[train]")
    train_dir = tmp_path / "run"
    # Ray's socket paths must stay under 108 bytes: a short folder of its own.
    ray_temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    environ = {k: v for k, v in os.environ.items()
               if k not in ("RAY_ADDRESS", "TF_CONFIG", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")}
    environ.update(PYTHONPATH=helpers.python_path(ROOT), TF_CPP_MIN_LOG_LEVEL="2",
                   RAY_TMPDIR=ray_temp, RAY_AUTH_TOKEN=secrets.token_hex(16),
                   RAY_TRAIN_V2_ENABLED="1")
    held = one_ray_cluster_at_a_time()
    held.__enter__()   # released once every process of the run has ended, below
    process = subprocess.Popen(
        [sys.executable, str(EXAMPLE), f"--train_dir={train_dir}",
         f"--max_steps={MAX_STEPS}"],
        cwd=ROOT, env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True)   # its own session: every process it starts
    try:
        output, _ = process.communicate(timeout=RUN_BUDGET_SECS)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        deadline = time.monotonic() + 20   # Ray's processes end after ray.shutdown()
        while session_members(process.pid) and time.monotonic() < deadline:
            time.sleep(0.25)
        left = session_members(process.pid)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(ray_temp, ignore_errors=True)
        held.__exit__(None, None, None)
    assert not left, f"processes of the example's Ray cluster left: {left}"
    assert process.returncode == 0, output[-4000:]
    assert f"finished: 2 workers at global step {MAX_STEPS}" in output, output[-4000:]
    for worker in (0, 1):   # TF_CONFIG named loopback addresses only
        assert re.search(rf"worker {worker} of 2 at 127\.0\.0\.1:\d+: finished at global "
                         rf"step {MAX_STEPS}", output), output[-4000:]
    assert not re.search(r"worker \d of 2 at (?!127\.0\.0\.1:)", output), output[-4000:]
    for folder in (train_dir, train_dir / "worker_1"):
        assert (folder / f"model.ckpt-{MAX_STEPS}.index").exists(), sorted(os.listdir(folder))

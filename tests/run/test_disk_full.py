"""A full disk: the write probe of validate_config and the first save each say so in one
line, and leave nothing of towerlib's half-written in the run folder.

The disk is a small tmpfs, filled, mounted in a new user and mount namespace of the test's
own (`unshare --user --map-root-user --mount`): no privilege, nothing outside it sees it."""

import json
import os
import shutil
import subprocess
import sys

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MOUNT = "/tmp/towerlib-full-disk"   # a mount point inside the namespace only
# 64 KiB, all taken by a filler: neither the tiny model's checkpoint nor a 2-byte probe
# can be written (their files are created; their pages cannot be).
SCRIPT = (f"mkdir -p {MOUNT} && mount -t tmpfs -o size=64k tmpfs {MOUNT} && "
          f"dd if=/dev/zero of={MOUNT}/filler bs=1k count=64 2>/dev/null; "
          f"exec {sys.executable} -m tests.run.disk_full_run {MOUNT}/run {MOUNT}/filler")


@pytest.mark.slow   # a fresh Python that builds and runs a graph
@pytest.mark.skipif(not shutil.which("unshare"), reason="needs util-linux's unshare")
def test_a_full_disk_is_one_line_and_leaves_no_partial_file():
    completed = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", SCRIPT],
        capture_output=True, text=True, timeout=240, cwd=REPO_ROOT,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    if "unshare failed" in completed.stderr or "mount:" in completed.stderr:
        pytest.skip(completed.stderr.strip().splitlines()[-1])   # no namespaces here
    reports = [json.loads(line) for line in completed.stdout.splitlines()
               if line.startswith("{")]
    assert len(reports) == 2, completed.stdout + completed.stderr
    probe, after_run = reports
    assert "no space left on device" in probe["probe"].lower(), probe
    assert probe["left"] == []   # the probe's file is gone though it was created
    last = completed.stderr.strip().splitlines()[-1]
    assert last.startswith("towerlib.run.run_entries.DiskFullError: Saving the checkpoint "
                           "of step 0 in ") and "no space left on device. Fix: free space" \
        in last and "no checkpoint was written yet" in last, completed.stderr[-3000:]
    assert ".saving" not in after_run["left"] and not any(
        name.startswith("model.ckpt") for name in after_run["left"]), after_run

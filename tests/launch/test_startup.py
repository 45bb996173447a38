"""The launcher starts its first task without importing TensorFlow: at about the cost of
a bare Python, measured against `python -c pass` (time to the first task, peak memory)."""

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow   # fresh Pythons

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The launcher's whole life, run as `python -m towerlib.launch` runs it; at exit (the
# launcher exits through SystemExit) it says whether TensorFlow was ever imported.
LAUNCHER = """
import atexit, runpy, sys
atexit.register(lambda: sys.stderr.write(
    "tensorflow imported: %s\\n" % ("tensorflow" in sys.modules)))
sys.argv = ["towerlib-launch"] + sys.argv[1:]
runpy.run_module("towerlib.launch", run_name="__main__", alter_sys=True)
"""
# Runs a command; prints its wall time to the first task's start (the task writes
# its clock into a file), and its peak memory (KiB, its own and its children's).
MEASURE = """
import os, resource, subprocess, sys, time
marker = sys.argv[1]
started = time.time()
subprocess.run(sys.argv[2:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
first = float(open(marker).read()) if os.path.exists(marker) else time.time()
print(first - started, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""
STAMP = "import sys, time; open(sys.argv[1], 'w').write(repr(time.time()))"


def run_launcher(*argv):
    return subprocess.run([sys.executable, "-c", LAUNCHER, *argv], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120)


def test_the_launcher_never_imports_tensorflow():
    done = run_launcher("--workers", "2", "--", sys.executable, "-c", "pass")
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[-1] == "tensorflow imported: False", done.stderr


def test_a_usage_error_imports_no_tensorflow_either():
    done = run_launcher("--workers", "0", "--", "true")
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == "tensorflow imported: False", done.stderr


def measure(tmp_path, name, command):
    """(seconds to the first task, peak KiB) of `command`, the best of 3 runs."""
    runs = []
    for attempt in range(3):
        marker = str(tmp_path / f"{name}-{attempt}")
        done = subprocess.run(
            [sys.executable, "-c", MEASURE, marker, *[part.replace("MARKER", marker)
                                                      for part in command]],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        seconds, kib = done.stdout.split()
        runs.append((float(seconds), int(kib)))
    return min(r[0] for r in runs), min(r[1] for r in runs)


def test_start_to_first_task_and_peak_memory_against_a_bare_python(tmp_path):
    bare = measure(tmp_path, "bare", [sys.executable, "-c", STAMP, "MARKER"])
    launched = measure(tmp_path, "launch", [
        sys.executable, "-m", "towerlib.launch", "--workers", "1", "--",
        sys.executable, "-c", STAMP, "MARKER"])
    time_ratio = launched[0] / bare[0]
    memory_ratio = launched[1] / bare[1]
    print(f"\ntowerlib-launch to its first task: {launched[0]:.3f} s, {time_ratio:.1f}x a "
          f"bare python ({bare[0]:.3f} s); peak memory {launched[1] / 1024:.0f} MiB, "
          f"{memory_ratio:.1f}x ({bare[1] / 1024:.0f} MiB)", file=sys.stderr)
    # With TensorFlow imported it was about 9 s and 770 MB: 100x and more of both.
    assert time_ratio < 10 and memory_ratio < 4, (launched, bare)

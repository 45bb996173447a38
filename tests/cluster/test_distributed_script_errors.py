"""examples/distributed/train.py: a user's mistake is one line and status 2; --help is quick.

Issue 34, items 13 and 14: these exited 1 with a traceback, and --help waited for
TensorFlow's import (5.7 s).
"""

import os
import re
import subprocess
import sys
from concurrent import futures

import pytest

from tests import helpers
from towerlib import cluster as cluster_lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "examples", "distributed", "train.py")


def run(args, timeout=180):
    environ = dict(os.environ, PYTHONPATH=helpers.python_path(ROOT), CUDA_VISIBLE_DEVICES="")
    environ.pop("TF_CONFIG", None)
    return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          timeout=timeout, env=environ, cwd=ROOT)


def test_the_flag_defaults_are_the_librarys():
    """The script defines its flags before importing towerlib: its literal defaults must
    stay the library's constants."""
    text = open(SCRIPT).read()
    for flag, constant in (("step_deadline_secs", cluster_lib.DEFAULT_STEP_DEADLINE_SECS),
                           ("ps_restart_timeout_secs",
                            cluster_lib.DEFAULT_PS_RESTART_TIMEOUT_SECS)):
        default = re.search(rf'DEFINE_float\("{flag}", ([0-9.]+)', text)
        assert default and float(default.group(1)) == constant, flag


PROBE = """
import runpy, sys
sys.argv = [%r] + %r
try:
    runpy.run_path(%r, run_name="__main__")
except SystemExit as exit:
    sys.stderr.write("exit %%s, tensorflow imported: %%s\\n"
                     %% (exit.code, "tensorflow" in sys.modules))
"""


@pytest.mark.slow  # fresh processes importing TensorFlow
def test_user_mistakes_are_one_line_and_status_2(tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("not a folder")
    cases = {
        "--task_index=5": (["--job_name=worker", "--task_index=5",
                            "--worker_hosts=127.0.0.1:5001,127.0.0.1:5002",
                            "--variable_update=replicated"],
                           "error: worker 5: ValueError: cluster flags: task index 5 is "
                           "out of range"),
        "--bn_mode=bogus": (["--bn_mode=bogus"], "Unknown bn_mode 'bogus'. Fix:"),
        "--num_towers=0": (["--num_towers=0"], "num_towers must be at least 1, got 0"),
        "--train_dir=<a file>": ([f"--train_dir={a_file}"], "exists and is not a directory"),
        "--num_examples=0": (["--num_examples=0"], "--num_examples=0: give at least 1."),
    }
    with futures.ThreadPoolExecutor(2) as pool:
        done = {name: pool.submit(run, [SCRIPT, *args, "--max_steps=2",
                                        f"--train_dir={tmp_path / name}"
                                        if "train_dir" not in name else args[0]])
                for name, (args, _) in cases.items()}
    for name, (_, expected) in cases.items():
        completed = done[name].result()
        assert completed.returncode == 2, (name, completed.stderr[-2000:])
        errors = [line for line in completed.stderr.splitlines() if line.startswith("error")]
        assert len(errors) == 1 and expected in errors[0], (name, completed.stderr[-2000:])
        assert "Traceback" not in completed.stderr, name


@pytest.mark.slow  # fresh processes
def test_help_and_a_bad_flag_answer_before_tensorflow_loads():
    for args, status in ((["--help"], 1), (["--num_tower=2"], 2)):
        probe = run(["-c", PROBE % (SCRIPT, args, SCRIPT)], timeout=60)
        assert probe.stderr.splitlines()[-1] == (
            f"exit {status}, tensorflow imported: False"), probe.stderr[-2000:]
    bad = run([SCRIPT, "--num_tower=2"], timeout=60)
    assert bad.returncode == 2 and bad.stderr.splitlines() == [
        "error: Unknown command line flag 'num_tower'. Did you mean: num_towers? See "
        "--helpshort for the flags."]

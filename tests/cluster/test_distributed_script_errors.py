"""examples/distributed/train.py: a user's mistake is one line and status 2; --help is quick.

These exited 1 with a traceback, and --help waited for
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


def test_the_bn_mode_help_lists_every_mode():
    text = open(SCRIPT).read()
    help_text = re.search(r'DEFINE_string\("bn_mode", "first_tower",\s*((?:"[^"]*"\s*)+)\)',
                          text)
    assert help_text, "the --bn_mode flag's definition moved"
    assert all(f"'{mode}'" in help_text.group(1) for mode in ("first_tower", "all_towers",
                                                               "sync"))


@pytest.mark.slow  # the example in a fresh process, stopped by SIGTERM
def test_a_run_stopped_by_a_signal_says_so_not_finished(tmp_path):
    import signal
    import threading
    import time
    environ = dict(os.environ, PYTHONPATH=helpers.python_path(ROOT), CUDA_VISIBLE_DEVICES="")
    environ.pop("TF_CONFIG", None)
    command = [sys.executable, SCRIPT, "--max_steps=100000", "--num_towers=2",
               "--sleep_secs_per_step=0.2", "--log_every_n_steps=1",
               f"--train_dir={tmp_path / 'run'}"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, env=environ, cwd=ROOT) as process:
        watchdog = threading.Timer(300, process.kill)  # bounds the blocking reads too
        watchdog.start()
        try:
            deadline = time.monotonic() + 180
            for line in process.stdout:  # a step has run: the stop handler is in place
                if re.search(r"\bstep [2-9]\d*, loss", line) or time.monotonic() > deadline:
                    break
            process.send_signal(signal.SIGTERM)
            output, _ = process.communicate(timeout=120)
        finally:
            watchdog.cancel()
            if process.poll() is None:
                process.kill()
    assert process.returncode == 128 + signal.SIGTERM, output[-3000:]
    assert re.search(r"^stopped by SIGTERM: global_step=\d+ loss=", output, re.M), output[-3000:]
    assert "finished:" not in output

"""towerlib-launch --workers 1:2 end to end: a lost host shrinks the job, a later restart
grows it back, and the run ends with the weights of a run that kept 2 workers.

The script (elastic_job.py) trains 2 towers per worker on a global batch fixed by the
step, whatever the number of workers. Worker 1 ends its process with status 69 (its
host is lost) after step 10; the launcher restarts the job on worker 0 alone, with a
TF_CONFIG of one worker. In one run that worker goes on to step 20; in the other it
fails retryably (138) after step 15 and the launcher takes both workers again. Both
end at step 20 with every variable (weights, Momentum slots, batch norm's moving
statistics) within 1e-5 of a 2-worker launch of the same script. Each elastic run's
restart time (from the lost host to the first step after the restart) is printed
beside the 2-worker launch's same-size restart (its worker 1 fails with 138 after
step 10), from the steps' own times.

With --input global_batch the script reads towerlib.global_batch_input instead of its
own rows: those cases are skipped where towerlib has no global_batch_input yet. Its
position is in the variables the chief broadcasts, so the job grown back resumes from
the chief's newest checkpoint, one the lone worker wrote; with the script's own rows
it resumes from the newest checkpoint both workers have (before the loss).
"""

import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tests.launch.tasks import alive, wait_until

pytestmark = pytest.mark.slow

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(HERE))
JOB = os.path.join(HERE, "elastic_job.py")
MAX_STEPS = 20
BUDGET_SECS = 300   # one launch, its restarts included (about 40 s on 2 busy cores)
ATTEMPT = re.compile(r"^\[launch\] attempt (\d+): started (?:(\d+) workers? of \d+\.\.\d+: )?"
                     r"worker 0 \(pid (\d+)\)(?:, worker 1 \(pid (\d+)\))?", re.M)
STEP = re.compile(r"^\[worker (\d)\] step (\d+) restart (\d+) workers (\d) at ([0-9.]+)$",
                  re.M)
EXIT = re.compile(r"^\[worker (\d)\] exit (\d+) at step (\d+) at ([0-9.]+)$", re.M)


class Launch:
    """One `python -m towerlib.launch ... -- python elastic_job.py DIR 20 ...`, run to
    its end (or killed with its tasks at the budget)."""

    def __init__(self, tmp_path, name, workers, exits, job_input):
        self.train_dir = tmp_path / name
        self.out, self.err = tmp_path / f"{name}.out", tmp_path / f"{name}.err"
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
        command = [sys.executable, "-m", "towerlib.launch", "--workers", workers,
                   "--max_restarts", "3", "--", sys.executable, JOB, str(self.train_dir),
                   str(MAX_STEPS), "--input", job_input]
        for rule in exits:
            command += ["--exit", rule]
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            process = subprocess.Popen(command, stdout=out, stderr=err, env=env,
                                       cwd=REPO_ROOT, stdin=subprocess.DEVNULL,
                                       start_new_session=True)
        try:
            self.status = process.wait(BUDGET_SECS)
        finally:
            if process.poll() is None:   # its tasks die with it (PDEATHSIG, the watchdog)
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
        self.text, self.err_text = self.out.read_text(), self.err.read_text(errors="replace")

    def attempts(self):
        """[(worker count, [pids])] in the order started."""
        return [(int(size) if size else len([p for p in pids if p]),
                 [int(p) for p in pids if p])
                for _, size, *pids in ATTEMPT.findall(self.err_text)]

    def steps(self):
        """[(worker, global step, restart, workers, time)] as printed."""
        return [(int(w), int(s), int(r), int(n), float(t))
                for w, s, r, n, t in STEP.findall(self.text)]

    def restart_secs(self, restart):
        """From the exit that ended restart-1 to the first step of `restart`."""
        last_restart, ended = {}, None
        for line in self.text.splitlines():   # an exit follows its worker's step line
            step, exited = STEP.match(line), EXIT.match(line)
            if step:
                last_restart[step.group(1)] = int(step.group(3))
            elif exited and last_restart[exited.group(1)] == restart - 1:
                ended = float(exited.group(4))
        return min(t for _, _, r, _, t in self.steps() if r == restart) - ended

    def summary(self):
        return self.err_text.strip().splitlines()[-1]

    def describe(self):
        return (f"status {self.status}\n--- {self.out.name} (tail) ---\n{self.text[-3000:]}"
                f"\n--- {self.err.name} (tail) ---\n{self.err_text[-5000:]}")


def values(train_dir, step=MAX_STEPS):
    """Every numeric value of the checkpoint of `step` (the input's state left out)."""
    reader = tf.train.load_checkpoint(str(train_dir / f"model.ckpt-{step}"))
    return {name: reader.get_tensor(name)
            for name, dtype in reader.get_variable_to_dtype_map().items()
            if dtype not in (tf.string, tf.variant) and not name.startswith("global_batches")}


def assert_close(actual, expected, where):
    assert actual.keys() == expected.keys(), (where, sorted(actual), sorted(expected))
    for name, value in expected.items():
        np.testing.assert_allclose(actual[name], value, rtol=0, atol=1e-5,
                                   err_msg=f"{where}: {name}")


def assert_all_ended(*launches):
    pids = [pid for launch in launches for _, group in launch.attempts() for pid in group]
    assert pids
    wait_until(lambda: not any(alive(pid) for pid in pids), 10, "end of every task")


@pytest.fixture(scope="module")
def job_input():
    """The job's input: towerlib.global_batch_input, whose batches the worker count does
    not change (elastic_job.py's --input step_rows is its own step-keyed rows)."""
    return "global_batch"


@pytest.fixture(scope="module")
def fixed_run(tmp_path_factory, job_input):
    """2 workers throughout: worker 1 fails retryably after step 10, both restart. One
    launch, the reference of both elastic runs (it only reads its folder)."""
    launch = Launch(tmp_path_factory.mktemp("fixed_run"), "fixed", "2", ["1:10:138"],
                    job_input)
    assert launch.status == 0, launch.describe()
    assert [size for size, _ in launch.attempts()] == [2, 2], launch.describe()
    return launch


def test_a_lost_host_shrinks_the_job_which_ends_as_a_fixed_size_run(
        tmp_path, job_input, fixed_run):
    elastic = Launch(tmp_path, "shrunk", "1:2", ["1:10:69"], job_input)
    assert elastic.status == 0, elastic.describe()
    assert [size for size, _ in elastic.attempts()] == [2, 1], elastic.describe()
    assert elastic.summary().startswith(
        "[launch] summary: attempt 1 on 2 workers: worker 1 exited 69 (its host is lost)")
    assert elastic.summary().endswith("done on 1 worker, status 0 after 1 restart(s)")
    # Worker 0 alone, in a cluster of one, took every step after the restart.
    after = [(w, s, n) for w, s, r, n, _ in elastic.steps() if r == 1]
    assert {(w, n) for w, s, n in after} == {(0, 1)}, after
    resumed_from = min(s for _, s, _ in after) - 1
    assert 8 <= resumed_from <= 10 and max(s for _, s, _ in after) == MAX_STEPS, after

    reference = values(fixed_run.train_dir)
    assert_close(values(elastic.train_dir), reference, "chief")
    # The steps taken by one worker moved the weights far more than the tolerance.
    moved = np.abs(values(elastic.train_dir, resumed_from)["w1"] - reference["w1"]).max()
    assert moved > 1e-3, moved
    print(f"\nrestart on 1 worker after a lost host: {elastic.restart_secs(1):.1f} s from "
          f"the loss to the first step; the same-size restart: "
          f"{fixed_run.restart_secs(1):.1f} s ({job_input})")
    assert_all_ended(fixed_run, elastic)


def test_a_later_restart_takes_the_lost_worker_back(tmp_path, job_input, fixed_run):
    elastic = Launch(tmp_path, "regrown", "1:2", ["1:10:69", "0:15:138"], job_input)
    assert elastic.status == 0, elastic.describe()
    assert [size for size, _ in elastic.attempts()] == [2, 1, 2], elastic.describe()
    assert elastic.summary().endswith("done on 2 workers, status 0 after 2 restart(s)")
    by_restart = {}
    for worker, step, restart, workers, _ in elastic.steps():
        by_restart.setdefault(restart, set()).add((worker, workers))
    assert by_restart == {0: {(0, 2), (1, 2)}, 1: {(0, 1)}, 2: {(0, 2), (1, 2)}}
    regrown_from = min(s for _, s, r, _, _ in elastic.steps() if r == 2) - 1
    if job_input == "global_batch":   # the lone worker's steps are kept
        assert regrown_from > 10, elastic.describe()

    reference = values(fixed_run.train_dir)
    for folder in ("", "worker_1"):
        assert_close(values(elastic.train_dir / folder), reference, f"'{folder}'")
    print(f"\nrestarts: on 1 worker after the lost host {elastic.restart_secs(1):.1f} s, "
          f"back on 2 workers {elastic.restart_secs(2):.1f} s (resumed from step "
          f"{regrown_from}); the same-size restart {fixed_run.restart_secs(1):.1f} s "
          f"({job_input})")
    assert_all_ended(fixed_run, elastic)

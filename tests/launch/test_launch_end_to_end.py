"""towerlib.launch end to end: 2 workers x 2 towers of a user's own
script (launch_job.py); worker 1 SIGKILLed mid-run; the launcher stops worker 0, starts
both again, they resume from the newest checkpoint both have and end bit-identical to an
uninterrupted launch of the same job; no process is left. Also measures the restart time
(from the kill to the first step after the resume) and prints it."""

import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from tests.launch.tasks import alive, wait_until

pytestmark = pytest.mark.slow

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(HERE))
JOB = os.path.join(HERE, "launch_job.py")
MAX_STEPS = 20
BUDGET_SECS = 400   # every wait of the test together, on 2 busy cores
STARTED = re.compile(r"\[launch\] attempt (\d+): started worker 0 \(pid (\d+)\), "
                     r"worker 1 \(pid (\d+)\)(?:, ps 0 \(pid (\d+)\))?")
STEP = re.compile(r"^\[worker (\d)\] step (\d+) restart (\d+) at ([0-9.]+)$", re.M)


class LaunchedJob:
    """`python -m towerlib.launch --workers 2 ... -- python launch_job.py DIR MAX_STEPS`."""

    def __init__(self, tmp_path, name, launch_flags=("--max_restarts", "2"),
                 max_steps=MAX_STEPS):
        self.train_dir = tmp_path / name
        self.out, self.err = tmp_path / f"{name}.out", tmp_path / f"{name}.err"
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
        command = [sys.executable, "-m", "towerlib.launch", "--workers", "2", *launch_flags,
                   "--", sys.executable, JOB, str(self.train_dir), str(max_steps)]
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.process = subprocess.Popen(command, stdout=out, stderr=err, env=env,
                                            cwd=REPO_ROOT, stdin=subprocess.DEVNULL,
                                            start_new_session=True)

    def started(self):
        """{attempt: (worker 0's pid, worker 1's pid[, ps 0's])} from the launcher's notes."""
        return {int(attempt): tuple(int(pid) for pid in pids if pid)
                for attempt, *pids in STARTED.findall(self.err_text())}

    def err_text(self):
        return self.err.read_text(errors="replace")

    def describe(self):
        return (f"--- {self.out.name} (tail) ---\n{self.out.read_text()[-3000:]}\n"
                f"--- {self.err.name} (tail) ---\n{self.err_text()[-5000:]}")

    def close(self):
        """SIGKILLs the launcher if it still runs; its tasks die with it (PDEATHSIG)."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)


def final_values(train_dir):
    """Every numeric tensor of the checkpoint of MAX_STEPS (the iterator's state left out)."""
    reader = tf.train.load_checkpoint(str(train_dir / f"model.ckpt-{MAX_STEPS}"))
    return {name: reader.get_tensor(name)
            for name, dtype in reader.get_variable_to_dtype_map().items()
            if dtype not in (tf.string, tf.variant)}


@pytest.fixture
def jobs(tmp_path):
    started = []
    yield lambda *args: started.append(LaunchedJob(tmp_path, *args)) or started[-1]
    for job in started:
        job.close()


def test_a_killed_worker_is_restarted_and_the_job_ends_bit_identical(jobs):
    deadline = time.monotonic() + BUDGET_SECS
    remaining = lambda: max(deadline - time.monotonic(), 1.0)
    whole, cut = jobs("whole"), jobs("cut")
    both_have_8 = lambda: all((cut.train_dir / sub / "model.ckpt-8.index").exists()
                              for sub in (".", "worker_1"))
    wait_until(lambda: both_have_8() or cut.process.poll() is not None, remaining(),
               "checkpoint 8 on both workers")
    assert cut.process.poll() is None, cut.describe()
    first_pids = cut.started()[1]
    killed_at = time.time()
    os.kill(first_pids[1], signal.SIGKILL)

    assert cut.process.wait(remaining()) == 0, cut.describe()
    assert whole.process.wait(remaining()) == 0, whole.describe()

    # The launcher named the failure and restarted both workers once.
    summary = cut.err_text().strip().splitlines()[-1]
    assert summary.startswith("[launch] summary: attempt 1: worker 1 exited 137 (killed by "
                              "SIGKILL), its last line: "), summary
    assert summary.endswith("done, status 0 after 1 restart(s)"), summary
    assert sorted(cut.started()) == [1, 2]
    # They resumed from a checkpoint both had (8 or later), not from the start.
    steps = [(int(w), int(s), int(r), float(t)) for w, s, r, t in
             STEP.findall(cut.out.read_text())]
    resumed = [s for w, s, r, t in steps if r == 1]
    assert resumed and 9 <= min(resumed) and max(resumed) == MAX_STEPS, steps
    first_step_after = min(t for w, s, r, t in steps if r == 1)
    print(f"\nrestart time (SIGKILL of worker 1 -> first step after the resume): "
          f"{first_step_after - killed_at:.1f} s; "
          f"{re.findall(r'attempt 2: .*?([0-9.]+ s after the failure)', cut.err_text())}")

    # Bit-identical to the uninterrupted launch, on both workers.
    for sub in ("", "worker_1"):
        uninterrupted = final_values(whole.train_dir / sub)
        restarted = final_values(cut.train_dir / sub)
        assert uninterrupted.keys() == restarted.keys() and uninterrupted, sub
        for name, value in uninterrupted.items():
            np.testing.assert_array_equal(restarted[name], value, err_msg=f"{sub} {name}")
    assert "w1" in uninterrupted and "w1/Momentum" in uninterrupted

    # No process of either job is left.
    pids = [pid for job in (whole, cut) for pair in job.started().values() for pid in pair]
    wait_until(lambda: not any(alive(pid) for pid in pids), 10, "end of every task")


def test_the_parameter_server_layout_ends_on_its_own(jobs):
    """--ps 1: the same script trains through the ps task, which ends once both workers
    are done (run_parameter_server); the launcher ends 0 without stopping it."""
    job = jobs("ps_layout", ("--ps", "1"), 8)
    assert job.process.wait(BUDGET_SECS) == 0, job.describe()
    out = job.out.read_text()
    assert "[ps 0] ps done: every worker finished" in out, job.describe()
    assert out.count("finished: global_step=8") == 2, job.describe()
    assert "did not end within" not in job.err_text()
    assert (job.train_dir / "model.ckpt-8.index").exists()
    (pids,) = job.started().values()
    assert len(pids) == 3
    wait_until(lambda: not any(alive(pid) for pid in pids), 10, "end of every task")

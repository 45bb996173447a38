"""`python -m towerlib.launch` as a user runs it: signals to the launcher, its status and
summary, --tasks, and no task left whichever way the launcher ends. Each test starts a
fresh launcher (it imports TensorFlow through towerlib: seconds on a busy machine)."""

import os
import signal
import subprocess
import sys

import pytest

from tests.launch.tasks import FAKE_TASK, alive, assert_none_alive, records, wait_until

pytestmark = pytest.mark.slow

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STARTUP_SECS = 120   # the launcher's import of TensorFlow on 2 busy cores


class Launch:
    """One launcher process with its output in files; always killed at the end."""

    def __init__(self, tmp_path, launch_flags, task_flags):
        self.out, self.err = tmp_path / "out.txt", tmp_path / "err.txt"
        self.records = tmp_path / "records"
        self.records.mkdir()
        command = [sys.executable, "-m", "towerlib.launch", *launch_flags, "--",
                   sys.executable, FAKE_TASK, "--record", str(self.records), *task_flags]
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.process = subprocess.Popen(command, stdout=out, stderr=err, cwd=REPO_ROOT,
                                            stdin=subprocess.DEVNULL, start_new_session=True)

    def wait_for_records(self, names):
        wait_until(lambda: set(names) <= set(records(self.records)), STARTUP_SECS,
                   f"records {names}")

    def wait(self, timeout_secs):
        return self.process.wait(timeout=timeout_secs)

    def text(self):
        return self.out.read_text(), self.err.read_text()

    def close(self):
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)


@pytest.fixture
def launches():
    started = []
    yield lambda *args: started.append(Launch(*args)) or started[-1]
    for launch in started:
        launch.close()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_launcher_reaches_every_task_and_is_its_status(
        tmp_path, launches, signum):
    launch = launches(tmp_path, ["--workers", "2", "--ps", "1", "--max_restarts", "3"],
                      ["--grandchild", "--sleep", "120"])
    launch.wait_for_records(["worker-0-0", "worker-1-0", "ps-0-0"])
    launch.process.send_signal(signum)
    assert launch.wait(30) == 128 + signum
    _, err = launch.text()
    summary = err.strip().splitlines()[-1]
    assert summary == (f"[launch] summary: stopped by {signal.Signals(signum).name}, "
                       f"status {128 + signum} after 0 restart(s)"), err
    assert_none_alive(launch.records)


def test_a_killed_launcher_takes_its_tasks_with_it(tmp_path, launches):
    """SIGKILL cannot be caught: the kernel kills the tasks (PR_SET_PDEATHSIG)."""
    launch = launches(tmp_path, ["--workers", "2"], ["--sleep", "120"])
    launch.wait_for_records(["worker-0-0", "worker-1-0"])
    pids = [record["pid"] for record in records(launch.records).values()]
    launch.process.kill()
    launch.wait(10)
    wait_until(lambda: not any(alive(pid) for pid in pids), 10, "end of the tasks")


def test_failure_summary_status_and_shown_tasks(tmp_path, launches):
    launch = launches(tmp_path, ["--workers", "2", "--max_restarts", "1", "--tasks",
                                 "worker:0"],
                      ["--fail", "worker:1:0:137", "--fail", "worker:1:1:2", "--grandchild",
                       "--sleep", "60"])
    assert launch.wait(STARTUP_SECS) == 2
    out, err = launch.text()
    assert "[worker 1]" not in out + err.replace("[launch]", "")
    assert err.strip().splitlines()[-1] == (
        "[launch] summary: attempt 1: worker 1 exited 137 (killed by SIGKILL), its last "
        "line: 'worker 1 fails with 137'; attempt 2: worker 1 exited 2 (a user's mistake), "
        "its last line: 'worker 1 fails with 2'; failed, status 2 after 1 restart(s)"), err
    assert_none_alive(launch.records)

"""Nothing a task starts outlives the launcher: a SIGKILLed launcher, SIGHUP (a closed
terminal), a stopped task. Checked in /proc: no process of a task's session is left."""

import io
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.launch.tasks import alive, assert_none_alive, fake_command, records, wait_until
from towerlib.launch import children as children_lib
from towerlib.launch import reaper
from towerlib.launch.output import Output
from towerlib.launch.plan import JobPlan, Task
from towerlib.launch.supervisor import Launcher

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GONE_SECS = 5.0   # for the kernel and the watchdog to finish killing

# Each task prints "sleep <pid>" for the `sleep 300` it started, then waits.
WRAPPER_SHELL = ["sh", "-c", "sleep 300 & echo sleep $!; wait"]
TWO_LEVELS = ["sh", "-c", "sh -c 'sleep 300 & echo sleep $!; wait' & wait"]
OWN_GROUP = [sys.executable, "-c",
             "import subprocess; p = subprocess.Popen(['sleep', '300'], process_group=0); "
             "print('sleep', p.pid, flush=True); p.wait()"]


class LauncherProcess:
    """`python -m towerlib.launch ...` with its output in files; always ended."""

    def __init__(self, tmp_path, argv):
        self.out, self.err = tmp_path / "out.txt", tmp_path / "err.txt"
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "towerlib.launch", *argv], stdout=out, stderr=err,
                stdin=subprocess.DEVNULL, cwd=REPO_ROOT, start_new_session=True)

    def task_pids(self):
        """{task pid: the pid of the `sleep` it printed} once both are known."""
        started = re.findall(r"worker (\d+) \(pid (\d+)\)", self.err.read_text())
        sleeps = re.findall(r"^\[worker (\d+)\] sleep (\d+)$", self.out.read_text(), re.M)
        if not started or len(sleeps) < len(started):
            return None
        return {int(pid): int(dict(sleeps)[index]) for index, pid in started}

    def close(self):
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)


@pytest.fixture
def launchers():
    started = []
    yield lambda *args: started.append(LauncherProcess(*args)) or started[-1]
    for launcher in started:
        launcher.close()


def assert_sessions_empty(sessions):
    """No process of these sessions (a task's pid is its session's id) is left."""
    deadline = time.monotonic() + GONE_SECS
    while any(reaper.session_members(s) for s in sessions) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert {s: reaper.session_members(s) for s in sessions} == {s: [] for s in sessions}


@pytest.mark.slow   # the launcher in a fresh process
@pytest.mark.parametrize("command", [WRAPPER_SHELL, TWO_LEVELS, OWN_GROUP],
                         ids=["wrapper_shell", "two_levels", "own_process_group"])
def test_a_sigkilled_launcher_leaves_no_descendant(tmp_path, launchers, command):
    launcher = launchers(tmp_path, ["--workers", "2", "--", *command])
    pids = wait_until(launcher.task_pids, 60, "the tasks' sleep pids")
    assert all(alive(pid) and alive(sleep) for pid, sleep in pids.items())
    launcher.process.kill()
    launcher.process.wait(10)
    wait_until(lambda: not any(alive(p) for pair in pids.items() for p in pair), GONE_SECS,
               "every task and its sleep gone")
    assert_sessions_empty(pids)


@pytest.mark.slow   # the launcher in a fresh process
def test_a_task_that_ends_leaves_nothing_in_its_process_group_or_session(tmp_path, launchers):
    """The launcher's own stop (here the task failing) kills what left its group too."""
    command = [sys.executable, "-c",
               "import subprocess, sys; p = subprocess.Popen(['sleep', '300'], "
               "process_group=0); print('sleep', p.pid, flush=True); sys.exit(2)"]
    launcher = launchers(tmp_path, ["--workers", "1", "--", *command])
    assert launcher.process.wait(60) == 2
    pids = launcher.task_pids()
    assert pids and not any(alive(sleep) for sleep in pids.values())
    assert_sessions_empty(pids)


@pytest.mark.slow   # the launcher in a fresh process
def test_sighup_is_a_stop_like_sigterm(tmp_path, launchers):
    """A closed terminal: the tasks get SIGTERM (they save on it), the launcher sums up
    and exits 129, and their children are gone."""
    record_dir = tmp_path / "records"
    record_dir.mkdir()
    launcher = launchers(tmp_path, ["--workers", "2", "--", *fake_command(
        record_dir, "--stop_secs", "0.3", "--sleep", "60", "--grandchild")])
    wait_until(lambda: len(records(record_dir)) == 2, 60, "2 task records")
    launcher.process.send_signal(signal.SIGHUP)
    assert launcher.process.wait(30) == 129
    for index in (0, 1):
        assert (record_dir / f"worker-{index}-signals.txt").read_text().split() == ["SIGTERM"]
    assert launcher.out.read_text().count("stopped cleanly") == 2
    last = launcher.err.read_text().strip().splitlines()[-1]
    assert last == "[launch] summary: stopped by SIGHUP, status 129 after 0 restart(s)", last
    assert_none_alive(record_dir)


def test_a_stopped_task_stops_with_the_others_not_after_the_grace(tmp_path):
    """SIGSTOPped, a task cannot act on SIGTERM: it gets SIGCONT right after, saves and
    exits like the others, instead of a SIGKILL after the whole grace."""
    out = io.BytesIO()
    launcher = Launcher(fake_command(tmp_path, "--stop_secs", "0.3", "--sleep", "60"),
                        JobPlan(2), Output(out, io.BytesIO()), stop_grace_secs=30.0)

    signalled = []

    def stop_worker_0_then_the_job():
        found = wait_until(lambda: len(records(tmp_path)) == 2 and records(tmp_path), 30,
                           "2 task records")
        os.kill(found["worker-0-0"]["pid"], signal.SIGSTOP)
        time.sleep(0.2)
        signalled.append(time.monotonic())
        launcher.forward_signal(signal.SIGTERM)

    thread = threading.Thread(target=stop_worker_0_then_the_job)
    thread.start()
    result = launcher.run()
    thread.join(5)
    assert result.status == 143
    assert time.monotonic() - signalled[0] < 10.0   # the grace is 30 s
    assert out.getvalue().decode().count("stopped cleanly") == 2, out.getvalue()
    assert (tmp_path / "worker-0-signals.txt").read_text().split() == ["SIGTERM"]
    assert_none_alive(tmp_path)


def test_stop_children_continues_a_stopped_task(tmp_path):
    """The attempt's end after a failure: the stopped task is stopped within the grace
    it would have had running (here 0.3 s of saving), not after the 30 s grace."""
    output = Output(io.BytesIO(), io.BytesIO())
    env = dict(os.environ, TF_CONFIG='{"cluster": {"worker": ["127.0.0.1:1"]}, '
                                     '"task": {"type": "worker", "index": 0}}')
    child = children_lib.start_child(
        Task("worker", 0), fake_command(tmp_path, "--stop_secs", "0.3", "--sleep", "60"),
        env, output)
    try:
        wait_until(lambda: records(tmp_path), 30, "the task's record")
        os.kill(child.pid, signal.SIGSTOP)
        began = time.monotonic()
        children_lib.stop_children([child], grace_secs=30.0)
        assert time.monotonic() - began < 10.0
        assert child.status() == 143   # its own clean exit: 128 + SIGTERM
    finally:
        children_lib.stop_children([child], grace_secs=1.0)


def test_a_child_another_launcher_is_starting_is_never_taken_for_an_orphan(monkeypatch):
    """Two launchers in one process (hosts simulated by threads): a scan for orphans
    that runs while one launcher's child is forked but not yet recorded must not see it
    (it would be SIGKILLed as an orphan)."""
    real_popen = subprocess.Popen
    seen_mid_start = []

    def popen_then_scan(*args, **kwargs):
        process = real_popen(*args, **kwargs)
        scan = threading.Thread(target=lambda: seen_mid_start.extend(
            pid for pid, _ in reaper._orphans(known=set(), since=0)))
        scan.start()
        scan.join(0.5)   # the other launcher's scan, between the fork and the record
        popen_then_scan.scans.append(scan)
        return process

    popen_then_scan.scans = []
    monkeypatch.setattr(children_lib.subprocess, "Popen", popen_then_scan)
    child = children_lib.start_child(Task("worker", 0), ["sleep", "30"], dict(os.environ),
                                     Output(io.BytesIO(), io.BytesIO()))
    try:
        for scan in popen_then_scan.scans:
            scan.join(10.0)
            assert not scan.is_alive()
        assert child.pid not in seen_mid_start
    finally:
        children_lib.stop_children([child], grace_secs=1.0)

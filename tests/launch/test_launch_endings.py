"""How a job ends, in the launcher's words and processes: why a failure was not
restarted, an attempt that took no step, SIGUSR1 as a requeue request, and nothing
left behind by a daemon that left its session or by a killed watchdog."""

import io
import os
import re
import signal
import sys
import time

import pytest

from tests.launch.tasks import alive, assert_none_alive, fake_command, records, wait_until
from tests.launch.test_reaper import WRAPPER_SHELL, LauncherProcess, launchers  # noqa: F401
from towerlib.launch.output import Output
from towerlib.launch.plan import JobPlan
from towerlib.launch.supervisor import Launcher

pytestmark = pytest.mark.slow   # each starts processes (a few seconds each)

GONE_SECS = 5.0


def launch(command, workers=2, **options):
    """Runs a job in this process; returns (JobResult, its stdout, its stderr)."""
    out, err = io.BytesIO(), io.BytesIO()
    options.setdefault("stop_grace_secs", 5.0)
    result = Launcher(command, JobPlan(workers), Output(out, err), **options).run()
    return result, out.getvalue().decode(), err.getvalue().decode()


def test_an_elastic_job_out_of_restarts_on_a_lost_host_says_so(tmp_path):
    """--workers 1:3 --max_restarts 1: a lost host, a restart on 2, a second lost host
    with no restart left: 69, and the summary says the budget ran out."""
    command = fake_command(tmp_path, "--fail", "worker:2:0:69", "--fail", "worker:1:1:69",
                           "--sleep", "30")
    result, _, _ = launch(command, workers=3, min_workers=1, max_restarts=1)
    assert result.status == 69 and result.restarts == 1
    assert result.summary().endswith(
        "the restart budget ran out: --max_restarts 1 used up; failed on 2 workers, "
        "status 69 after 1 restart(s)"), result.summary()
    assert_none_alive(tmp_path)


@pytest.mark.parametrize("max_restarts, words", [
    (1, "the restart budget ran out: --max_restarts 1 used up"),
    (0, "no restart allowed: --max_restarts 0")])
def test_a_retryable_failure_past_the_budget_says_so(tmp_path, max_restarts, words):
    flags = ["--fail", "worker:0:0:138", "--fail", "worker:0:1:138", "--sleep", "30"]
    result, _, _ = launch(fake_command(tmp_path, *flags), max_restarts=max_restarts)
    assert result.status == 138
    assert result.summary().endswith(f"; {words}; failed, status 138 after "
                                     f"{max_restarts} restart(s)"), result.summary()


def test_an_attempt_that_took_no_step_is_said(tmp_path):
    """Attempt 1 logs 3 steps before worker 1 fails with 138; attempt 2 logs none
    before worker 1 fails again: only attempt 2 is said to have taken no step."""
    flags = ["--fail", "worker:1:0:138", "--fail", "worker:1:1:2", "--sleep", "30"]
    step_flags = fake_command(tmp_path, *flags)
    # Steps on the first attempt only: the rule is the task's restart (its environment).
    command = [sys.executable, "-c",
               "import os, subprocess, sys; steps = '3' if os.environ["
               "'TOWERLIB_LAUNCH_RESTART'] == '0' else '0'; sys.exit(subprocess.call("
               "sys.argv[1:] + ['--steps', steps]))", *step_flags]
    result, out, err = launch(command, max_restarts=1)
    assert result.status == 2 and out.count("step 3, loss = ") == 2, out
    notes = [line for line in err.splitlines() if "took no step" in line]
    assert notes == ["[launch] attempt 2 took no step: no task logged one (towerlib's "
                     "'step N, loss = ...' line) before it ended."], err
    assert_none_alive(tmp_path)


DOUBLE_FORK = [sys.executable, "-c", """
import os, sys, time
first = os.fork()
if first == 0:
    os.setsid()
    second = os.fork()
    if second:
        print("daemon", second, flush=True)
        os._exit(0)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    time.sleep(300)
    os._exit(0)
os.waitpid(first, 0)
time.sleep(0.5)
"""]
SETSID_SLEEP = ["sh", "-c", "setsid sleep 300 </dev/null >/dev/null 2>&1 & "
                "echo daemon $!; sleep 0.5; exit 0"]


@pytest.mark.parametrize("command", [DOUBLE_FORK, SETSID_SLEEP],
                         ids=["double_fork", "setsid_sleep"])
def test_a_daemon_that_left_its_session_is_ended_with_the_job(tmp_path, command):
    result, out, err = launch(command, workers=1)
    assert result.status == 0, err
    (daemon,) = [int(pid) for pid in re.findall(r"^\[worker 0\] daemon (\d+)$", out, re.M)]
    try:
        wait_until(lambda: not alive(daemon), GONE_SECS, f"end of the daemon {daemon}")
        assert "ended 1 process(es) the tasks left outside their sessions" in err, err
    finally:
        if alive(daemon):
            os.kill(daemon, signal.SIGKILL)


def test_a_daemon_that_left_its_session_dies_with_a_sigkilled_launcher(
        tmp_path, launchers):  # noqa: F811
    """Seen by the launcher while the task runs, the daemon's session is the watchdog's
    too: a SIGKILLed launcher leaves neither the task nor its daemon."""
    command = DOUBLE_FORK[:-1] + [DOUBLE_FORK[-1].replace("time.sleep(0.5)",
                                                          "time.sleep(120)")]
    launcher = launchers(tmp_path, ["--workers", "1", "--", *command])
    daemon = int(wait_until(lambda: re.search(r"^\[worker 0\] daemon (\d+)$",
                                              launcher.out.read_text(), re.M), 60,
                            "the daemon's pid").group(1))
    try:
        wait_until(lambda: f"left process(es) {daemon} outside its session"
                   in launcher.err.read_text(), 20, "the launcher's note of the daemon")
        launcher.process.kill()
        launcher.process.wait(10)
        wait_until(lambda: not alive(daemon), GONE_SECS, f"end of the daemon {daemon}")
    finally:
        launcher.close()
        if alive(daemon):
            os.kill(daemon, signal.SIGKILL)


def watchdog_of(launcher_pid):
    """The pid of the launcher's watchdog: its child running `python -S -c`."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as stat:
                parent = int(stat.read().rpartition(")")[2].split()[1])
            with open(f"/proc/{name}/cmdline", "rb") as cmdline:
                argv = cmdline.read().split(b"\0")
        except (OSError, ValueError):
            continue
        if parent == launcher_pid and argv[1:3] == [b"-S", b"-c"]:
            return int(name)
    return None


def test_a_killed_watchdog_then_a_killed_launcher_leave_nothing(tmp_path, launchers):  # noqa: F811
    launcher = launchers(tmp_path, ["--workers", "1", "--", *WRAPPER_SHELL])
    pids = wait_until(launcher.task_pids, 60, "the task's sleep pid")
    try:
        watchdog = wait_until(lambda: watchdog_of(launcher.process.pid), 10, "the watchdog")
        os.kill(watchdog, signal.SIGKILL)
        wait_until(lambda: "started a new one" in launcher.err.read_text(), 10,
                   "the launcher's note of a new watchdog")
        launcher.process.kill()
        launcher.process.wait(10)
        wait_until(lambda: not any(alive(p) for pair in pids.items() for p in pair),
                   GONE_SECS, "every task and its sleep gone")
    finally:
        launcher.close()
        for pid in [p for pair in pids.items() for p in pair if alive(p)]:
            os.kill(pid, signal.SIGKILL)


def test_sigusr1_is_a_requeue_request_the_tasks_save_and_the_status_is_143(
        tmp_path, launchers):  # noqa: F811
    """Slurm's --signal=USR1@N: the tasks get SIGTERM (they save), the launcher sums up
    and exits 143, not 138, which the docs' sbatch loop reads as 'restart me'."""
    record_dir = tmp_path / "records"
    record_dir.mkdir()
    launcher = launchers(tmp_path, ["--workers", "2", "--", *fake_command(
        record_dir, "--stop_secs", "0.3", "--sleep", "60", "--grandchild")])
    wait_until(lambda: len(records(record_dir)) == 2, 60, "2 task records")
    time.sleep(0.2)   # the launcher's handlers are set before the tasks start
    launcher.process.send_signal(signal.SIGUSR1)
    assert launcher.process.wait(30) == 143
    for index in (0, 1):
        assert (record_dir / f"worker-{index}-signals.txt").read_text().split() == ["SIGTERM"]
    assert launcher.out.read_text().count("stopped cleanly") == 2
    last = launcher.err.read_text().strip().splitlines()[-1]
    assert last == ("[launch] summary: stopped by SIGUSR1 (a requeue request: the tasks "
                    "got SIGTERM), status 143 after 0 restart(s)"), last
    assert_none_alive(record_dir)


def test_a_task_past_the_stop_grace_is_named_with_the_stop_time(tmp_path):
    """A survivor that does not exit on SIGTERM (as one blocked in a step whose peer is
    gone) is SIGKILLed at --stop_grace_secs, and the launcher says so and how long the
    stop took."""
    flags = ["--fail", "worker:1:0:2", "--ignore_term", "--sleep", "60"]
    result, _, err = launch(fake_command(tmp_path, *flags), stop_grace_secs=1.0)
    assert result.status == 2
    (note,) = [line for line in err.splitlines() if "did not exit within" in line]
    stopped = float(re.search(r"every task stopped ([0-9.]+) s after it", note).group(1))
    assert note.startswith("[launch] worker 0 did not exit within --stop_grace_secs 1 of "
                           "the stop signal: SIGKILLed"), note
    assert 1.0 <= stopped < 8.0, note
    assert_none_alive(tmp_path)


@pytest.mark.parametrize("given, seen", [(None, "1"), ("0", "0")])
def test_tasks_start_without_tensorflows_info_lines_unless_asked(given, seen):
    """TensorFlow's C++ banner and INFO lines would print on every attempt of every
    task: tasks get TF_CPP_MIN_LOG_LEVEL=1 (warnings and errors stay), unless it is set."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    if given is not None:
        env["TF_CPP_MIN_LOG_LEVEL"] = given
    command = [sys.executable, "-c",
               "import os; print('level', os.environ.get('TF_CPP_MIN_LOG_LEVEL'))"]
    result, out, err = launch(command, workers=1, env=env)
    assert result.status == 0, err
    assert f"level {seen}" in out, out

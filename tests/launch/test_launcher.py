"""The launcher's attempts with fake tasks (no TensorFlow): restarts, statuses, ports,
and no process left behind on any path. The launcher runs in this process."""

import io
import json
import signal
import socket
import threading
import time

import pytest

from tests.launch.tasks import alive, assert_none_alive, fake_command, records, wait_until
from towerlib.launch import ports as ports_lib
from towerlib.launch.output import Output
from towerlib.launch.plan import JobPlan, Task
from towerlib.launch.supervisor import Launcher


def launch(tmp_path, workers=2, ps=0, flags=(), **options):
    """Runs a job of fake tasks; returns (JobResult, its stdout text, its stderr text)."""
    out, err = io.BytesIO(), io.BytesIO()
    options.setdefault("stop_grace_secs", 5.0)
    launcher = Launcher(fake_command(tmp_path, *flags), JobPlan(workers, ps),
                        Output(out, err), **options)
    result = launcher.run()
    return result, out.getvalue().decode(), err.getvalue().decode()


def test_every_task_ends_zero_the_job_ends_zero(tmp_path):
    result, out, err = launch(tmp_path, ps=1, flags=["--grandchild"])
    assert result.status == 0 and result.failures == [] and result.restarts == 0
    assert {"[worker 0] worker 0 done", "[worker 1] worker 1 done", "[ps 0] ps 0 done"} <= \
        set(out.splitlines())
    found = records(tmp_path)
    assert sorted(found) == ["ps-0-0", "worker-0-0", "worker-1-0"]
    configs = {name: record["tf_config"] for name, record in found.items()}
    assert configs["worker-1-0"]["task"] == {"type": "worker", "index": 1}
    assert configs["ps-0-0"]["task"] == {"type": "ps", "index": 0}
    assert len({json.dumps(c["cluster"]) for c in configs.values()}) == 1
    assert result.summary() == "summary: done, status 0 after 0 restart(s)"
    assert_none_alive(tmp_path)   # the grandchildren (`sleep 300`) too


def test_a_killed_worker_restarts_the_job(tmp_path):
    result, out, err = launch(tmp_path, max_restarts=2, flags=["--fail", "worker:1:0:137"])
    assert result.status == 0 and result.restarts == 1, err
    (failure,) = result.failures
    assert (failure.task.name, failure.status) == ("worker 1", 137)
    assert failure.last_line == "worker 1 fails with 137"
    assert "attempt 1: worker 1 exited 137 (killed by SIGKILL), its last line: " \
        "'worker 1 fails with 137'; done, status 0 after 1 restart(s)" in result.summary()
    assert "every task stopped, restarting the job (1 of 2)" in err
    found = records(tmp_path)
    assert {"worker-0-1", "worker-1-1"} <= set(found)
    ports_of = lambda name: found[name]["tf_config"]["cluster"]["worker"]
    assert set(ports_of("worker-1-0")).isdisjoint(ports_of("worker-1-1"))   # fresh ports
    assert_none_alive(tmp_path)


def test_retryable_failures_beyond_max_restarts_end_the_job_with_their_status(tmp_path):
    flags = ["--fail", "worker:0:0:138", "--fail", "worker:0:1:138", "--sleep", "30"]
    started = time.monotonic()
    result, _, _ = launch(tmp_path, max_restarts=1, flags=flags)
    assert result.status == 138 and result.restarts == 1
    assert [(f.attempt, f.task.name, f.status) for f in result.failures] == \
        [(0, "worker 0", 138), (1, "worker 0", 138)]
    assert time.monotonic() - started < 20   # worker 1 stopped by SIGTERM, not waited for
    assert_none_alive(tmp_path)


@pytest.mark.parametrize("status", [1, 2])
def test_a_mistake_or_a_bug_is_not_restarted(tmp_path, status):
    result, _, _ = launch(tmp_path, max_restarts=3,
                          flags=["--fail", f"worker:1:0:{status}", "--sleep", "30"])
    assert result.status == status and result.restarts == 0
    assert [(f.task.name, f.status) for f in result.failures] == [("worker 1", status)]
    assert_none_alive(tmp_path)


def test_a_lost_host_restarts_an_elastic_job_on_the_workers_that_remain(tmp_path):
    """--workers 1:2: worker 1 says its host is lost (exits 69); the job restarts on
    worker 0 alone, with a TF_CONFIG of one worker; a later restart (a retryable 138)
    takes both workers again, each with a TF_CONFIG of two."""
    flags = ["--fail", "worker:1:0:69", "--fail", "worker:0:1:138", "--sleep", "0.5"]
    result, out, err = launch(tmp_path, workers=2, min_workers=1, max_restarts=3,
                              flags=flags)
    assert result.status == 0 and result.restarts == 2, err
    assert [(f.task.name, f.status, f.workers) for f in result.failures] == \
        [("worker 1", 69, 2), ("worker 0", 138, 1)]
    found = records(tmp_path)
    assert sorted(found) == ["worker-0-0", "worker-0-1", "worker-0-2", "worker-1-0",
                             "worker-1-2"]   # no worker 1 on the restart after its loss
    sizes = {name: len(record["tf_config"]["cluster"]["worker"])
             for name, record in found.items()}
    assert sizes == {"worker-0-0": 2, "worker-1-0": 2, "worker-0-1": 1, "worker-0-2": 2,
                     "worker-1-2": 2}
    assert found["worker-0-1"]["tf_config"]["task"] == {"type": "worker", "index": 0}
    assert "restarting the job on the remaining 1 worker (1 of 3)" in err
    assert "restarting the job on 2 workers (2 of 3)" in err
    started = [line for line in err.splitlines() if ": started " in line]
    assert [line.split(": started ")[1].split(":")[0] for line in started] == \
        ["2 workers of 1..2", "1 worker of 1..2", "2 workers of 1..2"], started
    assert result.summary().startswith(
        "summary: attempt 1 on 2 workers: worker 1 exited 69 (its host is lost), its last "
        "line: 'worker 1 fails with 69'; attempt 2 on 1 worker: worker 0 exited 138")
    assert result.summary().endswith("done on 2 workers, status 0 after 2 restart(s)")
    assert_none_alive(tmp_path)


def test_an_elastic_job_with_fewer_than_min_workers_left_ends_host_lost(tmp_path):
    """--workers 2:3: a host lost on each of two attempts leaves 1 worker: the end."""
    flags = ["--fail", "worker:2:0:69", "--fail", "worker:1:1:69", "--sleep", "30"]
    started = time.monotonic()
    result, _, _ = launch(tmp_path, workers=3, min_workers=2, max_restarts=3, flags=flags)
    assert result.status == 69 and result.restarts == 1
    assert [(f.task.name, f.workers) for f in result.failures] == \
        [("worker 2", 3), ("worker 1", 2)]
    assert result.summary().endswith(
        "1 worker left after 1 lost host(s), fewer than the 2 --workers asks for at "
        "least; failed on 2 workers, status 69 after 1 restart(s)"), result.summary()
    assert time.monotonic() - started < 20   # worker 0 stopped, not waited for
    assert_none_alive(tmp_path)


def test_a_lost_host_past_max_restarts_ends_the_elastic_job_with_its_status(tmp_path):
    flags = ["--fail", "worker:2:0:69", "--fail", "worker:1:1:69", "--sleep", "30"]
    result, _, err = launch(tmp_path, workers=3, min_workers=1, max_restarts=1,
                            flags=flags)
    assert result.status == 69 and result.restarts == 1, err
    assert [(f.task.name, f.workers) for f in result.failures] == \
        [("worker 2", 3), ("worker 1", 2)]
    assert result.summary().endswith("failed on 2 workers, status 69 after 1 restart(s)")
    assert_none_alive(tmp_path)


def test_a_lost_host_ends_a_fixed_size_job_with_its_status(tmp_path):
    result, _, _ = launch(tmp_path, max_restarts=3,
                          flags=["--fail", "worker:1:0:69", "--sleep", "30"])
    assert result.status == 69 and result.restarts == 0
    assert result.summary() == (
        "summary: attempt 1: worker 1 exited 69 (its host is lost), its last line: "
        "'worker 1 fails with 69'; a fixed --workers 2 never restarts on 69 (a lost "
        "host); --workers MIN:2 (MIN < 2) would restart on the workers that remain; "
        "failed, status 69 after 0 restart(s)")
    assert_none_alive(tmp_path)


class _Ended:
    """A task seen ended, as Launcher._first_failure looks at it."""

    def __init__(self, job, index, started_at):
        self.task, self.started_at = Task(job, index), started_at

    def join_readers(self):
        pass


@pytest.mark.parametrize("ended, cause", [
    ([("worker", 0, 138), ("worker", 1, 137)], ("worker 1", 137)),  # the echo of a SIGKILL
    ([("worker", 1, 2), ("worker", 0, 138)], ("worker 1", 2)),
    ([("ps", 0, 137), ("worker", 1, 137)], ("worker 1", 137)),
    ([("worker", 1, 138), ("worker", 0, 138)], ("worker 0", 138)),     # the first started
])
def test_the_cause_is_named_rather_than_its_echo(ended, cause):
    """Tasks seen ended in the same poll: the failure named is the cause."""
    launcher = Launcher(["true"], JobPlan(2, 1), Output(io.BytesIO(), io.BytesIO()))
    failed = [(_Ended(job, index, started_at=index), status) for job, index, status in ended]
    failure = launcher._first_failure(0, failed)
    assert (failure.task.name, failure.status) == cause


def test_a_port_taken_between_the_choice_and_the_bind_is_retried_on_new_ports(tmp_path):
    """The first attempt's ports are not held and one is taken by another process, as
    happens without the hold; the task cannot listen and the launcher retries."""
    thief = socket.socket()
    thief.bind(("0.0.0.0", 0))
    thief.listen(1)
    calls = []

    def hold_ports(count):
        calls.append(count)
        if len(calls) == 1:
            return _Unheld([thief.getsockname()[1]] + ports_lib.hold_free_ports(
                count - 1).ports)
        return ports_lib.hold_free_ports(count)

    try:
        result, _, err = launch(tmp_path, flags=["--bind"], hold_ports=hold_ports)
    finally:
        thief.close()
    assert result.status == 0 and result.restarts == 0, err
    (failure,) = result.failures
    assert failure.task.name == "worker 0" and failure.status == 2
    assert "AddressError" in failure.last_line
    assert "retrying on new ports (1 of 3)" in err
    assert sorted(records(tmp_path)) == ["worker-0-0", "worker-1-0"]   # the retry's


class _Unheld(ports_lib.HeldPorts):
    def __init__(self, ports):
        super().__init__([])
        self.ports = ports


def test_held_ports_are_bound_by_the_tasks(tmp_path):
    """With the hold, a task that binds as TensorFlow does gets its port."""
    result, _, err = launch(tmp_path, ps=1, flags=["--bind"])
    assert result.status == 0 and result.failures == [], err


def test_ps_tasks_that_outlive_the_workers_are_stopped(tmp_path):
    result, _, err = launch(tmp_path, ps=1, ps_grace_secs=0.5,
                            flags=["--fail", "ps:0:0:0", "--sleep", "0"])
    assert result.status == 0, err
    started = time.monotonic()
    (tmp_path / "slow_ps").mkdir()
    result, _, err = launch(tmp_path / "slow_ps", ps=1, ps_grace_secs=0.5,
                            flags=["--fail", "worker:0:0:0", "--fail", "worker:1:0:0",
                                   "--sleep", "60"])
    assert result.status == 0 and time.monotonic() - started < 20, err
    assert "ps 0 did not end within 0.5 s of the workers; stopping it." in err


def test_a_task_that_ignores_sigterm_is_killed_after_the_grace(tmp_path):
    started = time.monotonic()
    result, _, _ = launch(tmp_path, stop_grace_secs=1.0,
                          flags=["--fail", "worker:1:0:2", "--ignore_term", "--sleep", "60"])
    assert result.status == 2 and time.monotonic() - started < 15
    assert_none_alive(tmp_path)


def test_the_launchers_own_exception_leaves_no_process(tmp_path, monkeypatch):
    def broken_watch(self, attempt):
        time.sleep(0.5)
        raise RuntimeError("a bug in the launcher")

    monkeypatch.setattr(Launcher, "_watch", broken_watch)
    with pytest.raises(RuntimeError, match="a bug in the launcher"):
        launch(tmp_path, flags=["--grandchild", "--sleep", "60"])
    assert_none_alive(tmp_path)


def free_port_base(count, avoid=()):
    """A port p with p..p+count-1 free now (for a multi-host job's fixed ports)."""
    for _ in range(50):
        with ports_lib.hold_free_ports(1) as held:
            base = held.ports[0]
        candidates = list(range(base, base + count))
        if set(candidates) & set(avoid) or base + count > 65535:
            continue
        try:
            ports_lib.check_free(candidates, "test")
            return base
        except ports_lib.PortTakenError:
            continue
    raise AssertionError("no free consecutive ports")


def test_two_hosts_shares_make_one_cluster(tmp_path):
    """Two launchers as on two hosts (here both 127.0.0.1, each with its own port base):
    every worker gets the same cluster and its own index, and binds its address."""
    first = free_port_base(2)
    second = free_port_base(2, avoid=range(first, first + 2))
    hosts = (f"127.0.0.1:{first}", f"127.0.0.1:{second}")
    results = {}

    def run_host(index):
        launcher = Launcher(fake_command(tmp_path, "--bind"),
                            JobPlan(2, hosts=hosts, host_index=index),
                            Output(io.BytesIO(), io.BytesIO()), stop_grace_secs=5.0)
        results[index] = launcher.run()

    threads = [threading.Thread(target=run_host, args=(index,)) for index in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert [results[i].status for i in (0, 1)] == [0, 0], results
    found = records(tmp_path)
    assert sorted(found) == [f"worker-{i}-0" for i in range(4)]
    expected = [f"127.0.0.1:{base + i}" for base in (first, second) for i in range(2)]
    for index in range(4):
        config = found[f"worker-{index}-0"]["tf_config"]
        assert config == {"cluster": {"worker": expected},
                          "task": {"type": "worker", "index": index}}


def test_a_signal_while_a_task_starts_reaches_that_task_too(tmp_path):
    """The signal comes after worker 0's process started but before the launcher
    listed it: worker 0 still gets it and stops, the tasks after it are not started,
    and nothing waits for the grace."""
    out, err = io.BytesIO(), io.BytesIO()
    launcher = Launcher(fake_command(tmp_path, "--stop_secs", "1.0", "--sleep", "60"),
                        JobPlan(2, 1), Output(out, err), stop_grace_secs=30.0)
    start = launcher._start

    def start_then_signal(task, cluster, restarts):
        child = start(task, cluster, restarts)
        if not launcher.signal:
            launcher.forward_signal(signal.SIGTERM)
        return child

    launcher._start = start_then_signal
    began = time.monotonic()
    result = launcher.run()
    said = out.getvalue().decode() + err.getvalue().decode()
    assert time.monotonic() - began < 20, said[-2000:]
    assert result.status == 128 + signal.SIGTERM and result.signal == signal.SIGTERM
    assert len(launcher.children) == 1   # the others were never started
    assert "did not exit within --stop_grace_secs" not in said
    assert not alive(launcher.children[0].pid)   # stopped by the signal, within its bound


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_the_launcher_reaches_each_task_once(tmp_path, signum):
    """A task that saves before it stops gets the time to (one signal, then the grace):
    a second one would tell towerlib's loop to stop at once, unsaved."""
    out = io.BytesIO()
    launcher = Launcher(fake_command(tmp_path, "--stop_secs", "1.0", "--sleep", "60"),
                        JobPlan(2, 1), Output(out, io.BytesIO()), stop_grace_secs=10.0)
    started = lambda: len(records(tmp_path)) == 3
    timer = threading.Thread(target=lambda: (wait_until(started, 30, "3 tasks"),
                                             launcher.forward_signal(signum)))
    timer.start()
    result = launcher.run()
    timer.join(5)
    assert result.status == 128 + signum and result.signal == signum
    assert result.failures == []
    for name in ("worker-0", "worker-1", "ps-0"):
        sent = (tmp_path / f"{name}-signals.txt").read_text().split()
        assert sent == [signal.Signals(signum).name], name
    assert out.getvalue().decode().count("stopped cleanly") == 3
    assert_none_alive(tmp_path)

"""A parameter server killed mid-run: restarted, training goes on; gone, workers stop.

One ps and two workers (examples/distributed/train.py, two virtual CPU towers
each, data keyed by the global step) as real processes on 127.0.0.1. Every
process is bounded by the ProcessGroup budget and killed in teardown, also
when a test fails.
"""

import re
import signal
import time

import pytest
import tensorflow as tf

from tests.distributed_processes import held_ports
from towerlib.cluster.exits import RETRYABLE
from towerlib.run import checkpoints

STEP_LOG = re.compile(r"step (\d+), loss = ([0-9.]+)")
RESTORED = re.compile(r"Restoring parameters from (\S+)")
PROCESS_BUDGET_SECS = 90  # hard bound on every process of a test (the `processes` fixture)
PS_RESTART_TIMEOUT_SECS = 3

# Every test starts a cluster of real processes.
pytestmark = pytest.mark.slow


def cluster_flags(train_dir, max_steps, extra=()):
    ps, worker0, worker1 = held_ports(3)
    return [f"--ps_hosts=127.0.0.1:{ps}",
            f"--worker_hosts=127.0.0.1:{worker0},127.0.0.1:{worker1}",
            f"--train_dir={train_dir}", f"--max_steps={max_steps}",
            "--global_batch_size=16", "--log_every_n_steps=1",
            "--sleep_secs_per_step=0.2", *extra]


def start_cluster(processes, flags):
    processes.start("ps", flags + ["--job_name=ps", "--ps_timeout_secs=80"])
    for task in (0, 1):
        processes.start(f"worker{task}", flags + [
            "--job_name=worker", f"--task_index={task}", "--num_towers=2"])


def checkpoint_step(prefix):
    """'.../model.ckpt-12' -> 12."""
    return int(prefix.rsplit("-", 1)[1])


def losses_by_step(text):
    """[(step, loss), ...] in the order logged."""
    return [(int(step), float(loss)) for step, loss in STEP_LOG.findall(text)]


def test_restarted_ps_training_goes_on_from_the_newest_checkpoint(processes, tmp_path):
    steps = 16
    train_dir = tmp_path / "train"
    flags = cluster_flags(train_dir, steps, ["--save_checkpoint_steps=2"])
    start_cluster(processes, flags)

    def checkpoint_at_step_6_or_later():
        checkpoint = tf.train.latest_checkpoint(str(train_dir))
        return checkpoint if checkpoint and checkpoint_step(checkpoint) >= 6 else None

    processes.wait_for(checkpoint_at_step_6_or_later, "checkpoint at step >= 6", 60,
                       watched="worker0")
    processes.kill("ps")
    # A save under way may still be published after the kill; once the chief has
    # lost its session (it then waits for the ps), nothing newer can appear.
    processes.wait_for_log("worker0", "Replica 0 lost its session", 60)
    newest = checkpoints.find_restorable_checkpoint(str(train_dir))
    before_kill = losses_by_step(processes.log_text("worker0"))
    assert max(step for step, _ in before_kill) < steps - 2, "ended before the kill"
    processes.start("ps", flags + ["--job_name=ps", "--ps_timeout_secs=80"])

    for name in ("worker0", "worker1", "ps"):
        code = processes.wait(name, 60)
        assert code == 0, f"{name} exited with {code}.\n" + processes.describe(name)

    chief_log = processes.log_text("worker0")
    recreated = chief_log.split("The chief's session is being recreated")
    assert len(recreated) == 2, processes.describe("worker0")
    restored = RESTORED.findall(recreated[1])
    # The chief restored the newest checkpoint on disk, not fresh weights
    # and not the one it chose at start (there was none then).
    assert restored[:1] == [newest], (restored, newest)
    after_restore = losses_by_step(recreated[1])
    assert after_restore[0][0] == checkpoint_step(newest) + 1, after_restore[:3]
    assert [step for step, _ in after_restore] == list(
        range(checkpoint_step(newest) + 1, steps + 1))
    # The data is keyed by the global step: a step redone from the newest
    # checkpoint has exactly the loss it had before the kill.
    first_run = dict(before_kill)
    for step, loss in after_restore:
        if step in first_run:
            assert loss == pytest.approx(first_run[step], abs=1e-6), step
    assert f"finished: global_step={steps}" in chief_log
    assert f"finished: global_step={steps}" in processes.log_text("worker1")
    # The restarted ps heard from both workers and exited by itself.
    assert "every worker is done" in processes.latest_log_text("ps")
    final = tf.train.latest_checkpoint(str(train_dir))
    assert checkpoint_step(final) == steps
    assert tf.train.load_checkpoint(final).get_tensor("global_step") == steps


def test_ps_gone_for_good_workers_stop_within_their_bound(processes, tmp_path):
    flags = cluster_flags(tmp_path / "train", 200,
                          [f"--ps_restart_timeout_secs={PS_RESTART_TIMEOUT_SECS}"])
    start_cluster(processes, flags)
    processes.wait_for_log("worker1", r"step [3-9], loss", 60)
    processes.kill("ps")
    killed_at = time.monotonic()

    # The bound: the old session's close (3 s), the wait for the ps, the
    # control session's close (3 s), plus process exit and a loaded machine's slack.
    bound = PS_RESTART_TIMEOUT_SECS + 3 + 3 + 30
    for name in ("worker0", "worker1"):
        code = processes.wait(name, bound - (time.monotonic() - killed_at))
        assert code == RETRYABLE, processes.describe(name)
        log = processes.log_text(name)
        assert re.search(
            rf"PsUnavailableError: Replica {name[-1]} lost its connection to ps task 0 "
            rf"\(ps:0 at 127\.0\.0\.1:\d+\) and it did not come back within "
            rf"{PS_RESTART_TIMEOUT_SECS} s", log), processes.describe(name)
        assert "restart it with the same command" in log
        assert "Traceback" not in log, log[-3000:]  # one line
    assert time.monotonic() - killed_at < bound


@pytest.mark.parametrize("fault", ["kill", "stop"])
def test_a_worker_lost_for_good_stops_the_chief_and_the_ps_within_the_deadline(
        processes, tmp_path, fault):
    """A worker killed (or SIGSTOPped) at step ~5 and never back:
    the chief logs that it waits, then every other process exits within the step
    deadline + a few seconds with one line naming what to restart."""
    deadline = 8
    flags = cluster_flags(tmp_path / "train", 200, [f"--step_deadline_secs={deadline}"])
    start_cluster(processes, flags)
    processes.wait_for_log("worker1", r"step [5-9], loss", 60)
    if fault == "kill":
        processes.kill("worker1")
    else:
        processes.signal("worker1", signal.SIGSTOP)
    lost_at = time.monotonic()
    # The step's deadline, the session's close, exit, a loaded machine's slack: far
    # below the default deadline (300 s).
    bound = deadline + 3 + 3 + 30
    for name in ("worker0", "ps"):
        code = processes.wait(name, bound - (time.monotonic() - lost_at))
        assert code == RETRYABLE, processes.describe(name)
    assert time.monotonic() - lost_at < bound
    chief = processes.log_text("worker0")
    assert "waiting" in chief and "for the other replicas" in chief
    lines = [line for line in chief.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "ReplicaLostError" in lines[0], chief[-3000:]
    expected = ("worker task 1" if fault == "kill" else "one is stopped")
    assert expected in lines[0] and "restart" in lines[0]
    assert "Traceback" not in chief
    assert "replica 0 stopped on an error" in processes.log_text("ps")

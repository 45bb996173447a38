"""One ps and two workers as real processes on 127.0.0.1.

Each worker runs two virtual CPU towers on its half of a fixed global batch
of 16 (examples/distributed/train.py: step s uses rows s*16 .. s*16+15 of a
fixed table; worker r takes rows r*8 .. r*8+7). One process with four towers
on the same 16 rows is the reference: synchronous training must give the same
weights. Every process is bounded by the ProcessGroup budget and killed in
teardown.
"""

import re
import time

import numpy as np
import pytest
import tensorflow as tf

from tests.distributed_processes import held_ports
from towerlib.cluster.exits import RETRYABLE
from towerlib.run import checkpoints

GLOBAL_BATCH = 16
TOWERS_PER_WORKER = 2
STEP_LOG = re.compile(r"step (\d+), loss = ([0-9.]+)")
PROCESS_BUDGET_SECS = 150  # hard bound on every process of a test (the `processes` fixture)

# Every test starts a cluster of real processes.
pytestmark = pytest.mark.slow


def cluster_flags(train_dir, max_steps, extra=()):
    ps, worker0, worker1 = held_ports(3)
    return [f"--ps_hosts=127.0.0.1:{ps}",
            f"--worker_hosts=127.0.0.1:{worker0},127.0.0.1:{worker1}",
            f"--train_dir={train_dir}", f"--max_steps={max_steps}",
            f"--global_batch_size={GLOBAL_BATCH}", "--log_every_n_steps=1",
            *extra]


def worker_flags(flags, task_index):
    return flags + ["--job_name=worker", f"--task_index={task_index}",
                    f"--num_towers={TOWERS_PER_WORKER}"]


def start_cluster(processes, flags):
    processes.start("ps", flags + ["--job_name=ps", "--ps_timeout_secs=120"])
    for task in (0, 1):
        processes.start(f"worker{task}", worker_flags(flags, task))


def wait_all_succeed(processes, names, timeout_secs):
    for name in names:
        code = processes.wait(name, timeout_secs)
        assert code == 0, f"{name} exited with {code}.\n" + processes.describe(name)


def checkpoint_values(train_dir):
    reader = tf.train.load_checkpoint(str(train_dir))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


def logged_losses(text):
    """{step: loss} from one process's log (the last value when a step repeats)."""
    return {int(step): float(loss) for step, loss in STEP_LOG.findall(text)}


def checkpoint_step(prefix):
    """'.../model.ckpt-12' -> 12."""
    return int(prefix.rsplit("-", 1)[1])


def last_logged_step(processes, name):
    steps = [int(step) for step, _ in STEP_LOG.findall(processes.log_text(name))]
    return max(steps) if steps else 0


def test_two_workers_train_like_one_process_with_four_towers(processes, tmp_path):
    steps = 3
    model_flags = ["--batch_norm", "--bn_mode=first_tower"]
    flags = cluster_flags(tmp_path / "distributed", steps, model_flags)
    processes.start("ps", flags + ["--job_name=ps", "--ps_timeout_secs=120"])
    processes.start("worker0", worker_flags(flags, 0))
    # Worker 1 gets a train_dir of its own, to show that it writes nothing.
    processes.start("worker1", worker_flags(flags, 1) + [
        f"--train_dir={tmp_path / 'worker1_dir'}"])
    processes.start("reference", [
        f"--train_dir={tmp_path / 'reference'}", f"--max_steps={steps}",
        f"--global_batch_size={GLOBAL_BATCH}", "--log_every_n_steps=1",
        f"--num_towers={2 * TOWERS_PER_WORKER}", "--data_order=rows_by_step", *model_flags])

    # Every process ends on its own: the workers at max_steps, the ps once
    # both workers have reported done.
    wait_all_succeed(processes, ["worker0", "worker1", "reference", "ps"], 120)
    assert "every worker is done" in processes.log_text("ps")
    # The chief alone writes checkpoints and summaries.
    assert not (tmp_path / "worker1_dir").exists() or not any(
        (tmp_path / "worker1_dir").iterdir())
    assert any(p.name.startswith("events.out.tfevents")
               for p in (tmp_path / "distributed").iterdir())

    distributed = checkpoint_values(tmp_path / "distributed")
    reference = checkpoint_values(tmp_path / "reference")
    assert sorted(distributed) == sorted(reference)
    assert distributed["global_step"] == reference["global_step"] == steps
    trainable = [name for name in reference
                 if name != "global_step" and "moving_" not in name]
    assert trainable, reference.keys()
    for name in trainable:
        difference = np.max(np.abs(distributed[name] - reference[name]))
        assert difference <= 1e-5, f"{name} differs by {difference}"
    # first_tower across workers: each worker updates the moving statistics
    # from its own tower 0, so they moved, but not as the reference's did.
    assert np.any(distributed["bn1/moving_mean"] != 0.0)
    assert not np.allclose(distributed["bn1/moving_mean"], reference["bn1/moving_mean"])

    # Step by step, the global loss is the mean of the two workers' losses
    # (equal halves of the batch): the weights agreed at every step.
    losses = [logged_losses(processes.log_text(name))
              for name in ("worker0", "worker1", "reference")]
    for step in range(1, steps + 1):
        assert losses[0][step] / 2 + losses[1][step] / 2 == pytest.approx(
            losses[2][step], abs=2e-4), f"step {step}: {losses}"


def test_killed_worker_restarts_and_training_reaches_the_last_step(processes, tmp_path):
    steps = 14
    flags = cluster_flags(tmp_path / "train", steps, ["--sleep_secs_per_step=0.2"])
    start_cluster(processes, flags)

    processes.wait_for_log("worker1", r"step ([3-9]|\d\d+), loss", 90)
    processes.kill("worker1")
    killed_after = last_logged_step(processes, "worker1")
    assert killed_after < steps - 3, "the run ended before the kill; slow it down"

    # Synchronous: without worker 1's gradient the chief completes at most
    # the step worker 1 had already pushed for.
    processes.wait_for_log("worker0", rf"step {killed_after}, loss", 30)
    time.sleep(2.0)  # ten steps' worth of pauses
    assert last_logged_step(processes, "worker0") <= killed_after + 1
    assert processes.processes["worker0"].poll() is None

    processes.start("worker1", worker_flags(flags, 1))
    wait_all_succeed(processes, ["worker0", "worker1", "ps"], 120)

    assert f"finished: global_step={steps}" in processes.log_text("worker0")
    restarted_log = processes.log_text("worker1").split("### start worker1")[-1]
    assert f"finished: global_step={steps}" in restarted_log
    assert last_logged_step(processes, "worker1") == steps
    assert "every worker is done" in processes.log_text("ps")
    assert checkpoint_values(tmp_path / "train")["global_step"] == steps


def test_restarted_chief_resumes_from_its_last_checkpoint(processes, tmp_path):
    steps = 14
    train_dir = tmp_path / "train"
    flags = cluster_flags(train_dir, steps,
                          ["--sleep_secs_per_step=0.2", "--save_checkpoint_steps=2"])
    start_cluster(processes, flags)

    def checkpoint_at_step_4_or_later():
        checkpoint = tf.train.latest_checkpoint(str(train_dir))
        return checkpoint if checkpoint and checkpoint_step(checkpoint) >= 4 else None

    processes.wait_for(checkpoint_at_step_4_or_later, "checkpoint at step >= 4", 90,
                       watched="worker0")
    processes.kill("worker0")
    # What a restart restores: the state file's newest, or a newer complete one
    # published just before the kill, before the state file listed it.
    checkpoint = checkpoints.find_restorable_checkpoint(str(train_dir))
    assert 4 <= checkpoint_step(checkpoint) < steps - 3, checkpoint

    processes.start("worker0", worker_flags(flags, 0))
    wait_all_succeed(processes, ["worker0", "worker1", "ps"], 120)

    restarted_log = processes.log_text("worker0").split("### start worker0")[-1]
    assert f"Restoring parameters from {checkpoint}" in restarted_log
    # The new chief went on from the checkpoint's step, not from 0.
    first_step = int(STEP_LOG.search(restarted_log).group(1))
    assert first_step == checkpoint_step(checkpoint) + 1, restarted_log[-2000:]
    assert f"finished: global_step={steps}" in restarted_log
    assert f"finished: global_step={steps}" in processes.log_text("worker1")
    assert checkpoint_values(train_dir)["global_step"] == steps


def test_missing_tasks_make_the_others_give_up_with_clear_errors(processes, tmp_path):
    # Cluster A: only the ps and worker 1 come up, so worker 1 waits for a
    # chief that never initializes the model and the ps for workers that
    # never finish. Cluster B: only its chief comes up, and no ps answers.
    flags = cluster_flags(tmp_path / "train", 3)
    processes.start("ps", flags + ["--job_name=ps", "--ps_timeout_secs=4"])
    processes.start("worker1", worker_flags(flags, 1) + ["--startup_timeout_secs=2"])
    lonely_flags = cluster_flags(tmp_path / "lonely", 3)
    processes.start("lonely_chief",
                    worker_flags(lonely_flags, 0) + ["--startup_timeout_secs=2"])

    assert processes.wait("worker1", 60) == RETRYABLE
    assert "The chief has not initialized the model after" in processes.log_text("worker1")
    assert processes.wait("ps", 60) == RETRYABLE
    assert "only 0 of 2 replicas finished within 4.0 s" in processes.log_text("ps")
    assert processes.wait("lonely_chief", 60) == RETRYABLE
    assert re.search(r"ps task 0 at 127\.0\.0\.1:\d+ did not answer within 2 s",
                     processes.log_text("lonely_chief")), processes.describe("lonely_chief")

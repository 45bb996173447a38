"""All-reduce across workers under faults: nobody hangs, a restart ends where no fault does.

Two workers, no ps (examples/distributed/train.py --variable_update=replicated,
two virtual CPU towers each, data keyed by the global step) as real processes
on 127.0.0.1, every one bounded by the ProcessGroup budget and killed in
teardown. TensorFlow's collectives cannot recover inside a process, so a lost
worker ends the job with one line on every other worker; restarting every
worker resumes from the newest checkpoint both have.
"""

import os
import re
import signal
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from tests.distributed_processes import ProcessGroup, held_ports
from towerlib.cluster.exits import RETRYABLE

PROCESS_BUDGET_SECS = 100
DEADLINE_SECS = 8
FINISHED = re.compile(r"finished: global_step=(\d+) loss=([0-9.]+)")

pytestmark = pytest.mark.slow


def worker_flags(train_dir, max_steps, extra=()):
    ports = held_ports(2)
    return [f"--worker_hosts=127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}",
            "--variable_update=replicated", "--num_towers=2", "--batch_norm",
            "--bn_mode=sync", f"--train_dir={train_dir}", f"--max_steps={max_steps}",
            "--global_batch_size=14", "--log_every_n_steps=1",
            f"--step_deadline_secs={DEADLINE_SECS}", "--startup_timeout_secs=30", *extra]


def start_workers(processes, flags, tasks=(0, 1), suffix=""):
    for task in tasks:
        processes.start(f"worker{task}{suffix}",
                        flags + ["--job_name=worker", f"--task_index={task}"])


def one_error_line(text):
    lines = [line for line in text.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    return lines[0]


@pytest.mark.parametrize("fault", ["kill", "sigstop"])
def test_a_lost_worker_stops_the_other_within_the_deadline(processes, tmp_path, fault):
    """Killed: the peer's step fails at once. Stopped: at the step deadline. Either
    way one line naming what happened and to restart every worker, status 138."""
    flags = worker_flags(tmp_path / "train", 500, ["--sleep_secs_per_step=0.1"])
    start_workers(processes, flags)
    processes.wait_for_log("worker0", r"step [5-9], loss", 60)
    if fault == "kill":
        processes.kill("worker1")
    else:
        processes.signal("worker1", signal.SIGSTOP)
    lost_at = time.monotonic()
    bound = DEADLINE_SECS + 30   # slack for a loaded machine; the default is 300 s
    assert processes.wait("worker0", bound) == RETRYABLE, processes.describe("worker0")
    assert time.monotonic() - lost_at < bound
    line = one_error_line(processes.log_text("worker0"))
    assert "WorkerLostError" in line and "restart every worker" in line
    if fault == "kill":
        assert "worker task 1" in line and "no longer accepts connections" in line
    else:
        assert "stopped (SIGSTOP)" in line
        assert "waiting" in processes.log_text("worker0")  # it said it was waiting


def test_a_worker_that_never_starts_is_named(processes, tmp_path):
    flags = worker_flags(tmp_path / "train", 20, ["--startup_timeout_secs=7"])
    start_workers(processes, flags, tasks=(0,))
    assert processes.wait("worker0", 40) == RETRYABLE, processes.describe("worker0")
    line = one_error_line(processes.log_text("worker0"))
    assert "worker task 1" in line and "did not start within 7 s" in line
    # While it waited, it said for whom and how long it would still wait (every 5 s).
    assert re.search(r"Waiting [5-7] s for worker 0's peers to start: worker task 1 "
                     r"\(127\.0\.0\.1:\d+\) not answering yet; [0-2] s left before the "
                     r"timeout", processes.log_text("worker0")), processes.describe("worker0")


def final_values(train_dir, step):
    reader = tf.train.load_checkpoint(str(train_dir / f"model.ckpt-{step}"))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
            if not name.startswith("_")}


def test_a_restarted_job_ends_bit_identical_to_an_uninterrupted_one(processes, tmp_path):
    """Worker 1 killed once both have checkpoint 8; worker 0 stops; both restarted
    resume from 8 or later and end at 20 with the uninterrupted run's loss and weights."""
    steps = ["--save_checkpoint_steps=4", "--sleep_secs_per_step=0.2"]
    start_workers(processes, worker_flags(tmp_path / "whole", 20, steps))
    start_workers(processes, worker_flags(tmp_path / "cut", 20, steps), suffix="_cut")
    both_have_8 = lambda: ((tmp_path / "cut" / "model.ckpt-8.index").exists() and
                           (tmp_path / "cut" / "worker_1" / "model.ckpt-8.index").exists())
    processes.wait_for(both_have_8, "checkpoint 8 on both workers", 60, watched="worker0_cut")
    processes.kill("worker1_cut")
    assert processes.wait("worker0_cut", DEADLINE_SECS + 10) == RETRYABLE
    for name in ("worker0", "worker1"):
        assert processes.wait(name, 80) == 0, processes.describe(name)
    restart = worker_flags(tmp_path / "cut", 20, steps)
    start_workers(processes, restart, suffix="_again")
    for name in ("worker0_again", "worker1_again"):
        assert processes.wait(name, 60) == 0, processes.describe(name)
    log = processes.log_text("worker0_again")
    resumed = re.search(r"Restoring .*model\.ckpt-(\d+)", log)
    assert resumed and int(resumed.group(1)) >= 8, log[-2000:]
    whole = FINISHED.findall(processes.log_text("worker0"))
    again = FINISHED.findall(log)
    assert whole == again and whole[0][0] == "20", (whole, again)
    uninterrupted, resumed_run = final_values(tmp_path / "whole", 20), \
        final_values(tmp_path / "cut", 20)
    assert uninterrupted.keys() == resumed_run.keys()
    for name, value in uninterrupted.items():
        np.testing.assert_array_equal(resumed_run[name], value, err_msg=name)


NAN_JOB = [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                        "allreduce_nan_job.py")]


def test_a_nan_in_one_workers_data_stops_every_worker_before_it_is_saved(tmp_path):
    """The NaN reaches every worker's update through the all-reduce: every worker
    raises NonFiniteError for that step, and no checkpoint holds it."""
    group = ProcessGroup(tmp_path, PROCESS_BUDGET_SECS, command=NAN_JOB)
    try:
        ports = ",".join(str(p) for p in held_ports(2))
        for task in (0, 1):
            group.start(f"worker{task}", [f"--task={task}", f"--ports={ports}",
                                          f"--train_dir={tmp_path / 'train'}"])
        for task in (0, 1):
            assert group.wait(f"worker{task}", 80) == 3, group.describe(f"worker{task}")
            log = group.log_text(f"worker{task}")
            assert "stopped: NonFiniteError: Non-finite values at step 4" in log, log[-2000:]
        newest = tf.train.latest_checkpoint(str(tmp_path / "train"))
        assert newest.endswith("model.ckpt-3"), newest  # step 4 never saved
        assert np.all(np.isfinite(tf.train.load_variable(newest, "w")))
    finally:
        group.close()


SHARDED_JOB = [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                            "sharded_slots_job.py")]


def test_an_inf_slot_on_one_worker_stops_every_workers_save(tmp_path):
    """Adam's slots sharded over 2 workers; from step 4 on, one slot of 'a' is Inf
    on its owner only (the weights and the loss stay finite). Every worker refuses
    the save of step 4 with NonFiniteError, the owner naming the slot, at once:
    none waits in the save's exchange for a worker that already stopped."""
    group = ProcessGroup(tmp_path, PROCESS_BUDGET_SECS, command=SHARDED_JOB)
    try:
        ports = ",".join(str(p) for p in held_ports(2))
        for task in (0, 1):
            group.start(f"worker{task}", [f"--task={task}", f"--ports={ports}",
                                          f"--train_dir={tmp_path / 'train'}",
                                          "--spike_from=3"])
        logs = []
        for task in (0, 1):
            assert group.wait(f"worker{task}", 80) == 3, group.describe(f"worker{task}")
            logs.append(group.log_text(f"worker{task}"))
            assert "stopped: NonFiniteError: Non-finite values at step 4" in logs[-1], \
                logs[-1][-2000:]
            assert "an optimizer slot sharded over the workers" in logs[-1], logs[-1][-2000:]
        owners = [task for task, log in enumerate(logs) if "the variable a/Adam_1" in log]
        assert len(owners) == 1, [log[-1500:] for log in logs]
        newest = tf.train.latest_checkpoint(str(tmp_path / "train"))
        assert newest.endswith("model.ckpt-3"), newest  # step 4 never saved
        reader = tf.train.load_checkpoint(newest)
        for name in reader.get_variable_to_shape_map():
            assert np.all(np.isfinite(reader.get_tensor(name))), name
        assert {"a/Adam", "a/Adam_1", "b/Adam", "b/Adam_1"} <= set(
            reader.get_variable_to_shape_map())
    finally:
        group.close()


def test_a_stop_signal_with_sharded_slots_stops_without_a_save_that_would_wait(tmp_path):
    """The last save of a stopped worker would gather the slots from every worker,
    which are at another step: the worker says it does not save, and stops at once,
    far within the step deadline (60 s); its newest checkpoint is the last periodic
    one (step 0 here), which every worker saved."""
    group = ProcessGroup(tmp_path, PROCESS_BUDGET_SECS, command=SHARDED_JOB)
    try:
        ports = ",".join(str(p) for p in held_ports(2))
        for task in (0, 1):
            group.start(f"worker{task}", [
                f"--task={task}", f"--ports={ports}", f"--train_dir={tmp_path / 'train'}",
                "--max_steps=500", "--sleep_secs_per_step=0.2", "--step_deadline_secs=60",
                "--save_checkpoint_steps=1000"])
        group.wait_for_log("worker1", r"step [3-9], loss", 60)
        group.signal("worker1", signal.SIGTERM)
        signalled = time.monotonic()
        group.wait("worker1", 40)
        assert time.monotonic() - signalled < 40
        log = group.log_text("worker1")
        stopped = re.search(r"Stopped by a signal at step (\d+): not saved", log)
        assert stopped, log[-3000:]
        newest = tf.train.latest_checkpoint(str(tmp_path / "train" / "worker_1"))
        assert newest and newest.endswith("model.ckpt-0"), newest
        assert group.wait("worker0", 40) == 3   # its peer is gone: WorkerLostError
    finally:
        group.close()


FLAGS_FIX = "Fix: start every worker with the same flags"
DATA_FIX = "Fix: give every worker the same data"


@pytest.mark.parametrize("flag, item, own, chief, fix", [
    ("--learning_rate=0.2", "optimizer learning_rate", "0.2", "0.1", FLAGS_FIX),
    ("--num_towers=1", "number of towers", "1", "2", FLAGS_FIX),
    ("--bn_mode=all_towers", "option bn_mode", "'all_towers'", "'sync'", FLAGS_FIX),
    ("--max_steps=30", "max_steps", "30", "20", FLAGS_FIX),
    # global_batch_input's source and order: another n, or another seed (which also
    # changes this example's table, but the seed is named: it is the cause).
    ("--num_examples=200", "input 'global_batches' examples", "200", "256", DATA_FIX),
    ("--seed=1", "input 'global_batches' seed", "1", "0", DATA_FIX),
])
def test_workers_built_from_different_flags_stop_at_once_naming_the_difference(
        processes, tmp_path, flag, item, own, chief, fix):
    """Copies that would drift apart (or a collective that would wait
    for the step deadline) are refused at startup, on both workers, in one line."""
    flags = worker_flags(tmp_path / "train", 20)
    processes.start("worker0", flags + ["--job_name=worker", "--task_index=0"])
    processes.start("worker1", flags + [flag, "--job_name=worker", "--task_index=1"])
    started = time.monotonic()
    for name in ("worker0", "worker1"):
        assert processes.wait(name, 60) == 2, processes.describe(name)
        line = one_error_line(processes.log_text(name))
        assert (f"Worker 1 builds another step than the chief: its {item} is {own}, the "
                f"chief's {chief}. {fix}") in line
        assert "step 1," not in processes.log_text(name)  # no step ran
    assert time.monotonic() - started < 60  # seconds, not a step deadline

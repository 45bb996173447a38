"""The CIFAR-10 example across two workers by all-reduce: the same flag as one machine.

`python -m examples.cifar10.train --variable_update=replicated` with
--worker_hosts and no --ps_hosts (worker 1 configured by TF_CONFIG) trains
every worker's towers with their gradients all-reduced, sync batch norm
included; the chief's checkpoint evaluates and exports as after a
one-machine run. Mismatched flags are refused with the fix.
"""

import sys

import pytest
import tensorflow as tf

from examples.cifar10 import eval as eval_lib
from examples.cifar10 import generate, job, options
from tests.distributed_processes import free_ports, held_ports
from towerlib import cluster as cluster_lib

PROCESS_COMMAND = [sys.executable, "-m", "examples.cifar10.train"]
PROCESS_BUDGET_SECS = 220
STEPS = 3


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("data"))
    generate.ensure_generated(folder)
    return folder


@pytest.mark.slow  # two workers as real processes, then one machine
def test_two_workers_all_reduce_and_the_run_resumes_on_one_machine_as_if_uninterrupted(
        processes, tmp_path, data_dir):
    """2 workers x 2 towers, sync batch norm, for STEPS steps (worker 0 by flags, worker 1
    by TF_CONFIG): both report the global batch's loss, each saves its own checkpoint, the
    chief's evaluates. Then one machine of 4 towers (--num_towers changed, the cluster
    flags gone: train_config.json rewritten) resumes the chief's folder to 2 x STEPS and
    ends bit-identical to a run that trained there from the start: the workers' CPU
    towers exchange through hubs that add as one process adds."""
    # The resume once failed with TensorFlow's NotFoundError (the workers' shuffle
    # buffers in the checkpoint) after rewriting train_config.json.
    ports = held_ports(2)
    hosts = [f"127.0.0.1:{p}" for p in ports]
    resized, whole = tmp_path / "resized", tmp_path / "uninterrupted"
    run_flags = [f"--data_dir={data_dir}", "--model=resnet8", "--device_type=cpu",
                 "--global_batch_size=16", "--bn_mode=sync", "--variable_update=replicated",
                 "--log_every_n_steps=1", "--seed=1", "--startup_timeout_secs=60"]
    two_workers = run_flags + [f"--train_dir={resized}", f"--max_steps={STEPS}",
                               "--num_towers=2"]
    processes.start("worker0", two_workers + [f"--worker_hosts={','.join(hosts)}",
                                              "--job_name=worker", "--task_index=0"])
    processes.start("worker1", two_workers, tf_config={
        "cluster": {"worker": hosts}, "task": {"type": "worker", "index": 1}})
    one_machine = run_flags + ["--num_towers=4", f"--max_steps={2 * STEPS}"]
    processes.start("whole", one_machine + [f"--train_dir={whole}"])
    for name in ("worker0", "worker1", "whole"):
        assert processes.wait(name, 100) == 0, processes.describe(name)

    chief_log = processes.log_text("worker0")
    assert "all-reduced across the 2 workers" in chief_log
    losses = [line.split("loss = ")[1].split(",")[0]
              for line in chief_log.splitlines() if f"step {STEPS}, loss = " in line]
    other = [line.split("loss = ")[1].split(",")[0]
             for line in processes.log_text("worker1").splitlines()
             if f"step {STEPS}, loss = " in line]
    assert losses and losses == other  # both report the global batch's loss
    assert tf.train.latest_checkpoint(str(resized)).endswith(f"model.ckpt-{STEPS}")
    assert tf.train.latest_checkpoint(str(resized / "worker_1")).endswith(
        f"model.ckpt-{STEPS}")  # worker 1's own: its input position
    result = eval_lib.evaluate_latest(str(resized))
    assert result.global_step == STEPS and result.examples == 1000

    processes.start("one_machine", one_machine + [f"--train_dir={resized}"])
    assert processes.wait("one_machine", 100) == 0, processes.describe("one_machine")
    assert f"at global step {STEPS}" in processes.log_text("one_machine")
    got = tf.train.load_checkpoint(str(resized / f"model.ckpt-{2 * STEPS}"))
    expected = tf.train.load_checkpoint(str(whole / f"model.ckpt-{2 * STEPS}"))
    names = [n for n, dtype in expected.get_variable_to_dtype_map().items()
             if dtype.is_floating]
    assert any("moving_mean" in n for n in names) and any("Momentum" in n for n in names)
    gap = max(abs(got.get_tensor(n) - expected.get_tensor(n)).max() for n in names)
    assert gap == 0.0, gap  # 2 x 2 CPU towers add as one process with 4 does


def _plan(tmp_path, data_dir, ps_hosts, **overrides):
    workers = ",".join(f"127.0.0.1:{p}" for p in free_ports(2))
    cluster = cluster_lib.cluster_from_flags(ps_hosts, workers, "worker", 0)
    settings = dict(train_dir=str(tmp_path / "train"), data_dir=data_dir, model="resnet8",
                    num_towers=2, device_type="cpu", global_batch_size=16, max_steps=STEPS)
    settings.update(overrides)
    return job.plan_run(settings, cluster=cluster)


def test_the_update_flag_chooses_the_path_and_mismatches_are_refused(tmp_path, data_dir):
    plan = _plan(tmp_path, data_dir, "", variable_update="replicated", bn_mode="sync")
    assert plan.allreduce and plan.batch_size == 8
    with pytest.raises(options.FlagError, match=r"has 1 ps task\(s\)\. Fix: drop --ps_hosts"):
        _plan(tmp_path, data_dir, "127.0.0.1:1", variable_update="replicated")
    with pytest.raises(options.FlagError, match="no ps task.*--variable_update=replicated"):
        _plan(tmp_path, data_dir, "")

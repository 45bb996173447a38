"""All-reduce across worker processes equals one machine: every copy, every step.

Each case starts W worker processes on free ports of 127.0.0.1 (N virtual CPU
towers each, no ps task) and, in the test's own process, the single-machine
definition of the same step: W x N towers whose tower t reads what member
t reads across workers (tests/cluster/allreduce_job.py). With bn_mode='sync'
it is also one device on the whole batch. After 5 steps on a global batch of
11 (uneven over the towers):

- every copy of every variable on every worker is bit-identical to the
  chief's tower 0 (weights, optimizer slots, moving statistics, global_step);
- each equals the single-machine run within 1e-5, and the losses too.
"""

import argparse
import json
import os
import sys

import numpy as np
import pytest
import tensorflow as tf

from tests.cluster import allreduce_job
from tests.distributed_processes import ProcessGroup, free_ports, held_ports, port_is_free

pytestmark = pytest.mark.slow

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "allreduce_job.py")
BUDGET_SECS = 150


@pytest.fixture
def processes(tmp_path):
    group = ProcessGroup(tmp_path, BUDGET_SECS, command=(sys.executable, JOB))
    yield group
    group.close()


def plain_name(name):
    """'replicated/tower_1/w1/Momentum' -> 'w1/Momentum'."""
    parts = name.split("/")
    if len(parts) > 2 and parts[0] == "replicated" and parts[1].startswith("tower_"):
        return "/".join(parts[2:])
    return name


CASES = [
    # workers, towers per worker, bn_mode, optimizer, accumulation_steps, model
    # (2, 2, "sync", "momentum", 1, "towerlib") by flags: the clip and dynamic cases
    # below differ from it in one option each, and test_a_schedulers_environment_is_the_cluster
    # runs it twice (its cluster from Slurm's or TFJob's variables instead of flags).
    (2, 2, "all_towers", "adam", 2, "towerlib"),
    (2, 2, "first_tower", "sgd", 1, "towerlib"),
    (3, 1, "sync", "adam", 1, "towerlib"),
    (3, 1, "first_tower", "momentum", 1, "towerlib"),
    (3, 1, "all_towers", "sgd", 1, "towerlib"),
    # The same network as a tf_keras model (towerlib.KerasTower).
    (2, 2, "sync", "momentum", 1, "keras"),
    (2, 2, "all_towers", "adam", 2, "keras"),
    # Clipped by the global norm of the gradient all-reduced over both workers.
    (2, 2, "sync", "momentum", 1, "clip"),
    # Batch sizes known only when the step runs: the examples are counted every step
    # (static ones are counted once, at start).
    (2, 2, "sync", "momentum", 1, "dynamic"),
    # Replicated(shard_update=True): the slots sharded over the 4 towers of both workers.
    (2, 2, "sync", "adam", 1, "sharded"),
    (2, 2, "all_towers", "momentum", 2, "sharded"),
]
# The weights each model names, and the first one's prefix (its slots are under it).
WEIGHTS = {"towerlib": ({"w1", "w2"}, "w1/"), "keras": ({"w1/kernel", "w2/kernel"}, "w1/kernel/"),
           "clip": ({"w1", "w2"}, "w1/"), "dynamic": ({"w1", "w2"}, "w1/"),
           "sharded": ({"w1", "w2"}, "w1/")}
CLIP_NORM = 0.1  # below the job's gradient norms (about 0.3-0.6)


def model_flags(model):
    """The job's --model, --clip_norm and --batch_sizes for a case's model column."""
    if model == "clip":
        return "towerlib", CLIP_NORM, "static"
    if model == "dynamic":
        return "towerlib", 0.0, "dynamic"
    if model == "sharded":
        return "towerlib", 0.0, "static"
    return model, 0.0, "static"


@pytest.mark.parametrize("workers, towers, bn_mode, optimizer, steps, model", CASES)
def test_workers_stay_identical_and_equal_one_machine(processes, tmp_path, workers, towers,
                                                     bn_mode, optimizer, steps, model):
    job_model, clip_norm, batch_sizes = model_flags(model)
    common = [f"--bn_mode={bn_mode}", f"--optimizer={optimizer}", f"--model={job_model}",
              f"--clip_norm={clip_norm}", f"--batch_sizes={batch_sizes}",
              f"--accumulation_steps={steps}", f"--init={tmp_path / 'init.npz'}"]
    if model == "sharded":
        common.append("--shard_update")
    ports = ",".join(str(p) for p in held_ports(workers))
    for task in range(workers):
        processes.start(f"worker{task}", common + [
            "--role=worker", f"--task={task}", f"--workers={workers}",
            f"--towers={towers}", f"--ports={ports}", f"--out={tmp_path / f'w{task}.npz'}"])
    check_against_one_machine(processes, tmp_path, workers, towers, bn_mode, optimizer,
                              steps, model)


def consecutive_free_ports(count, attempts=50):
    """A port p such that p .. p + count - 1 are free now (Slurm's port_base layout)."""
    for _ in range(attempts):
        base = free_ports(1)[0]
        if base + count < 65536 and all(
                port_is_free(base + i) for i in range(1, count)):
            return base
    raise RuntimeError(f"no {count} consecutive free ports in {attempts} attempts")


def scheduler_environment(scheduler, task, workers):
    """What `scheduler` sets for worker `task` of `workers`, ports free on localhost."""
    if scheduler == "slurm":   # srun -N 1 -n <workers>, one node
        return {"SLURM_PROCID": str(task), "SLURM_STEP_NUM_TASKS": str(workers),
                "SLURM_STEP_NODELIST": "localhost",
                "SLURM_STEP_TASKS_PER_NODE": str(workers)}
    # Kubeflow's training operator (TFJob): service names, an 'environment' key.
    return {"TF_CONFIG": json.dumps({
        "cluster": {"worker": [f"localhost:{port}" for port in PORTS[scheduler]]},
        "task": {"type": "worker", "index": task}, "environment": "cloud"})}


PORTS = {}


@pytest.mark.parametrize("scheduler", ["slurm", "tfjob"])
def test_a_schedulers_environment_is_the_cluster(processes, tmp_path, scheduler):
    """2 workers x 2 towers placed by srun's or TFJob's variables train as by flags."""
    workers, towers = 2, 2
    base = consecutive_free_ports(workers)
    PORTS[scheduler] = [base + i for i in range(workers)]
    common = ["--bn_mode=sync", "--optimizer=momentum", "--model=towerlib",
              "--clip_norm=0", "--accumulation_steps=1", f"--init={tmp_path / 'init.npz'}"]
    for task in range(workers):
        environment = scheduler_environment(scheduler, task, workers)
        environment["TOWERLIB_SLURM_PORT_BASE"] = str(base)
        processes.start(f"worker{task}", common + [
            "--role=worker", "--cluster=environment", f"--task={task}",
            f"--workers={workers}", f"--towers={towers}",
            f"--out={tmp_path / f'w{task}.npz'}"], extra_env=environment)
    check_against_one_machine(processes, tmp_path, workers, towers, "sync", "momentum", 1,
                              "towerlib")


def whole_state(dumps):
    """{name: value} of the chief's dump, with the slots only other workers hold (the
    optimizer sharded over the workers) added from theirs."""
    whole = {name: dumps[0][name] for name in dumps[0].files}
    for dump in dumps[1:]:
        for name in dump.files:
            if not name.startswith("replicated/") and name not in whole:
                whole[name] = dump[name]
    return whole


def check_against_one_machine(processes, tmp_path, workers, towers, bn_mode, optimizer,
                              steps, model):
    """Runs the references here while the workers train; compares every copy."""
    job_model, clip_norm, batch_sizes = model_flags(model)
    processes.wait_for(lambda: os.path.exists(tmp_path / "init.npz"),
                       "initial values from the chief", 90, watched="worker0")
    references = {"reference": workers * towers}
    if bn_mode == "sync":
        references["one_device"] = 1
    # The references need no server: run here, while the workers train.
    for role, count in references.items():
        with tf.Graph().as_default():
            allreduce_job.run(argparse.Namespace(
                role=role, task=0, workers=1, towers=count, ports="", bn_mode=bn_mode,
                optimizer=optimizer, accumulation_steps=steps, model=job_model,
                clip_norm=clip_norm, batch_sizes=batch_sizes, shard_update=model == "sharded",
                init=str(tmp_path / "init.npz"), out=str(tmp_path / f"{role}.npz")))
    for name in [f"worker{t}" for t in range(workers)]:
        assert processes.wait(name, 120) == 0, processes.describe(name)

    chief = whole_state([np.load(tmp_path / f"w{task}.npz") for task in range(workers)])
    for task in range(workers):
        worker = np.load(tmp_path / f"w{task}.npz")
        for name in worker.files:
            if name not in ("losses", "norms"):
                np.testing.assert_array_equal(
                    worker[name], chief[plain_name(name)],
                    err_msg=f"worker {task}'s {name} differs from the chief's tower 0")
        np.testing.assert_array_equal(worker["losses"], chief["losses"])
    weights, first = WEIGHTS[model]
    for role in references:
        reference = np.load(tmp_path / f"{role}.npz")
        compared = [n for n in reference.files if "/" not in n or not n.startswith("replicated")]
        assert weights | {"bn/moving_mean", "bn/moving_variance", "global_step"} <= set(compared)
        for name in compared:
            np.testing.assert_allclose(chief[name], reference[name], rtol=0, atol=1e-5,
                                       err_msg=f"{name}: workers vs {role}")
    slots = [n for n in chief
             if n.startswith(first) and n.count("/") == first.count("/")]
    assert len(slots) == {"sgd": 0, "momentum": 1, "adam": 2}[optimizer], slots
    if model == "sharded":   # each slot held once in the whole job, by its plain name
        held = [n for task in range(workers) for n in np.load(tmp_path / f"w{task}.npz").files
                if "/Adam" in n or "/Momentum" in n]
        assert not [n for n in held if n.startswith("replicated/")], held
        assert len(held) == len(set(held)) == len(weights | {"bn/beta", "bn/gamma"}) * len(
            slots), held
    assert int(chief["global_step"]) == 5
    if clip_norm:  # clipping was active: every step's global norm above the threshold
        assert min(chief["norms"]) > clip_norm, chief["norms"]


@pytest.mark.parametrize("bn_mode, optimizer, accumulation_steps",
                         [("sync", "adam", 1), ("all_towers", "momentum", 2)])
def test_sharded_workers_equal_unsharded_workers_bit_for_bit(processes, tmp_path, bn_mode,
                                                             optimizer, accumulation_steps):
    """2 x 2 with Replicated(shard_update=True) and with Replicated(), from the same
    values: the same exchange and the same update arithmetic, so every weight, slot,
    moving statistic and loss of every worker is the same bits. The start broadcast
    goes in 64-byte buffers, one variable each: a chain of exchanges across workers."""
    workers, towers = 2, 2
    common = [f"--bn_mode={bn_mode}", f"--optimizer={optimizer}", "--model=towerlib",
              f"--accumulation_steps={accumulation_steps}", "--role=worker",
              f"--workers={workers}", f"--towers={towers}", "--broadcast_chunk_bytes=64"]
    runs = {"sharded": ["--shard_update", f"--init={tmp_path / 'start.npz'}"],
            "unsharded": [f"--start={tmp_path / 'start.npz'}",
                          f"--init={tmp_path / 'unsharded_init.npz'}"]}
    for run, flags in runs.items():
        ports = ",".join(str(p) for p in held_ports(workers))
        for task in range(workers):
            processes.start(f"{run}{task}", common + flags + [
                f"--task={task}", f"--ports={ports}", f"--out={tmp_path / f'{run}{task}.npz'}"])
        if run == "sharded":   # the unsharded run starts from the sharded one's values
            processes.wait_for(lambda: os.path.exists(tmp_path / "start.npz"),
                               "initial values from the sharded chief", 90,
                               watched="sharded0")
    for name in [f"{run}{task}" for run in runs for task in range(workers)]:
        assert processes.wait(name, 120) == 0, processes.describe(name)
    first_slot = {"momentum": "w1/Momentum", "adam": "w1/Adam"}[optimizer]
    dumps = {run: [np.load(tmp_path / f"{run}{task}.npz") for task in range(workers)]
             for run in runs}
    for task in range(workers):
        sharded, unsharded = dumps["sharded"][task], dumps["unsharded"][task]
        # Sharded indeed: tower 1 holds a copy of the slot only without sharding, and
        # worker 1 holds no slot of w1 (owned by the chief's tower 0).
        assert f"replicated/tower_1/{first_slot}" in unsharded.files
        assert f"replicated/tower_1/{first_slot}" not in sharded.files
        assert (first_slot in sharded.files) == (task == 0)
        shared = set(sharded.files) & set(unsharded.files)
        assert {"w1", "w2", "bn/moving_mean", "bn/moving_variance", "losses",
                "replicated/tower_1/w1"} <= shared
        for name in sorted(shared):
            np.testing.assert_array_equal(
                sharded[name], unsharded[name],
                err_msg=f"worker {task}'s {name}: sharded vs unsharded, 2 x 2")
        assert int(sharded["global_step"]) == 5
    # Every slot is held by one worker only, and equals the unsharded one, bit for bit.
    slots = {name: task for task, dump in enumerate(dumps["sharded"]) for name in dump.files
             if not name.startswith("replicated/") and first_slot.split("/")[1] in name}
    whole = whole_state(dumps["unsharded"])
    assert sorted(slots) == sorted(n for n in whole if first_slot.split("/")[1] in n
                                   and not n.startswith("replicated/")), slots
    assert set(slots.values()) == {0, 1}
    for name, task in slots.items():
        np.testing.assert_array_equal(dumps["sharded"][task][name], whole[name],
                                      err_msg=f"{name}: sharded vs unsharded, 2 x 2")

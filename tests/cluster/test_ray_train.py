"""Ray Train runs towerlib's all-reduce and restarts it after a lost worker.

A real local Ray cluster (ray.init) and Ray Train's TensorflowTrainer (Train V2, the
default in ray 2.60) with 2 workers, each an actor process that Ray gives its TF_CONFIG
and that trains 2 virtual CPU towers (tests/cluster/ray_job.py). One run goes through;
in another, worker 1 SIGKILLs its own process after step 10. Worker 0's step then
fails and it raises WorkerLostError out of the training function (unless Ray's
controller saw the dead actor first and stopped it); Ray counts the failure and, under
FailureConfig(max_failures=1), restarts both workers in new processes with a new
TF_CONFIG; they resume from checkpoint 8, the newest both have, and end at step 20
with every variable bit-identical to the run that went through. After ray.shutdown()
no process the cluster started is left. The cluster stays on loopback: its node
address, which Ray Train writes into each worker's TF_CONFIG, is 127.0.0.1.

Skipped when ray cannot be imported: it is in the test extra (`ray[train]`).
"""

import glob
import json
import os
import secrets
import shutil
import sys
import tempfile
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
import tensorflow as tf

from tests.cluster import ray_job, ray_serial
from tests.cluster.progress_deadline import ProgressDeadline
from tests.process_table import descendants

pytestmark = [pytest.mark.slow, pytest.mark.one_ray_cluster,
              pytest.mark.filterwarnings("ignore::DeprecationWarning:ray\\.")]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# One trainer.fit() (about 35 s idle, the restart included) may take as long as its workers
# keep writing events, at most STALL_SECS apart, within a cap (tests/cluster/progress_deadline.py).
STALL_SECS = 420   # the first event waits for Ray to start both actors, slow under load
CAP_SECS = 1500
SHUTDOWN_BUDGET_SECS = 20
KILL_AT_STEP = 10


def command_name(pid):
    try:
        with open(f"/proc/{pid}/comm") as comm:
            return comm.read().strip()
    except OSError:
        return None


def still_alive(processes):
    """The ones of {pid: start time} that still run (the same process, not a reused pid)."""
    alive = {}
    for pid, started in processes.items():
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[19] == started and fields[0] != "Z":
            alive[pid] = fields[0]
    return alive


@pytest.fixture
def ray_cluster(monkeypatch):
    """A local Ray cluster of 4 logical CPUs; afterwards shut down, every process gone.

    The workers import tests.cluster.ray_job: the repository is on their PYTHONPATH.
    The cluster's token comes from the environment, so nothing is written to ~/.ray;
    its files go to a short folder (Ray's socket paths must stay under 108 bytes).
    Imported here, not when the tests are collected: the other runs do not pay for it.
    """
    # Loopback only: Ray takes the machine's interface address for its node (and so for
    # each worker's TF_CONFIG, whose servers listen on every interface) and turns a
    # _node_ip_address of 127.0.0.1 into that address too. With this variable off, read
    # when ray is imported (here, and in the processes the cluster starts), its node
    # address is 127.0.0.1 (ray._common.network_utils.get_localhost_ip).
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    ray = pytest.importorskip(
        "ray", reason="ray cannot be imported: pip install -e '.[test]' brings ray[train]")
    from ray._private import ray_constants  # imported by an earlier test: read already
    monkeypatch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", False)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        filter(None, [REPO, os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("RAY_AUTH_TOKEN", secrets.token_hex(16))
    monkeypatch.setenv("RAY_TRAIN_V2_ENABLED", "1")   # the default; said, not assumed
    monkeypatch.delenv("RAY_ADDRESS", raising=False)  # a cluster of its own, not a user's
    held = ray_serial.one_ray_cluster_at_a_time()
    held.__enter__()   # released after the shutdown below, whatever happens
    temp_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    seen = {}
    try:
        # Ray's own lines stay in its session logs (worker_errors reads them), not in
        # pytest's output.
        ray.init(num_cpus=4, num_gpus=0, include_dashboard=False, _temp_dir=temp_dir,
                 configure_logging=False, log_to_driver=False)
        addresses = [node["NodeManagerAddress"] for node in ray.nodes()]
        assert addresses == ["127.0.0.1"], f"the Ray node is not on loopback: {addresses}"
        yield SimpleNamespace(temp_dir=temp_dir, processes=seen)
    finally:
        seen.update(descendants())
        ray.shutdown()
        deadline = time.monotonic() + SHUTDOWN_BUDGET_SECS
        while still_alive(seen) and time.monotonic() < deadline:
            time.sleep(0.25)
        shutil.rmtree(temp_dir, ignore_errors=True)
        held.__exit__(None, None, None)
    left = still_alive(seen)
    assert not left, f"processes of the Ray cluster left after ray.shutdown(): {left}"
    assert not descendants(), f"processes left under the test: {descendants()}"


def fit(cluster, tmp_path, name, max_failures, kill=False):
    """One TensorflowTrainer run of ray_job.train_loop, bounded by its progress."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.tensorflow import TensorflowTrainer

    config = {"train_dir": str(tmp_path / name / "train"),
              "events": str(tmp_path / name / "events.txt")}
    os.makedirs(tmp_path / name)
    if kill:
        config.update(kill_rank=1, kill_at_step=KILL_AT_STEP,
                      kill_marker=str(tmp_path / name / "killed"))
    trainer = TensorflowTrainer(
        ray_job.train_loop, train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False,
                                     resources_per_worker={"CPU": 1}),
        run_config=RunConfig(name=name, storage_path=str(tmp_path / "ray_results"),
                             failure_config=FailureConfig(max_failures=max_failures)))
    outcome = {}

    def run():
        try:
            outcome["result"] = trainer.fit()
        except BaseException as error:  # noqa: BLE001 -- reported below
            outcome["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = ProgressDeadline(config["events"], STALL_SECS, CAP_SECS)
    deadline.join(thread)
    running = descendants()   # the cluster and this run's actors, checked after shutdown
    cluster.processes.update(running)
    names = {command_name(pid) for pid in running}
    assert {"raylet", "gcs_server"} <= names, names
    assert not thread.is_alive(), f"trainer.fit(): {deadline.reason()}"
    assert "error" not in outcome, outcome.get("error")
    assert outcome["result"].error is None, outcome["result"].error
    return config


def events(config):
    """[(event, rank, pid, global_step, time), ...] in the order written."""
    with open(config["events"]) as text:
        return [(name, int(rank), int(pid), int(step), float(when))
                for name, rank, pid, step, when in (line.split() for line in text)]


def worker_errors(cluster):
    """The errors Ray Train logged for the training functions that raised."""
    messages = []
    pattern = os.path.join(cluster.temp_dir, "session_*", "logs", "train",
                           "ray-train-app-worker-*.log")
    for path in glob.glob(pattern):
        with open(path) as log:
            for line in log:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if record.get("levelname") == "ERROR":
                    messages.append(record.get("message", ""))
    return messages


def final_values(train_dir):
    """Every saved value of the last checkpoint but the input's position (a variant)."""
    reader = tf.train.load_checkpoint(os.path.join(train_dir, f"model.ckpt-{ray_job.MAX_STEPS}"))
    return {name: reader.get_tensor(name)
            for name, dtype in reader.get_variable_to_dtype_map().items()
            if dtype != tf.variant}


def test_a_worker_killed_under_ray_train_is_restarted_and_the_run_ends_bit_identical(
        ray_cluster, tmp_path):
    began = time.monotonic()
    whole = fit(ray_cluster, tmp_path, "whole", max_failures=0)
    cut = fit(ray_cluster, tmp_path, "cut", max_failures=1, kill=True)

    # The uninterrupted run: one attempt, from step 0.
    starts = [e for e in events(whole) if e[0] == "start"]
    assert sorted((rank, step) for _, rank, _, step, _ in starts) == [(0, 0), (1, 0)], starts

    # The other: worker 1 killed after step 10, then both restarted in new processes,
    # resumed from checkpoint 8 and run to the end.
    log = events(cut)
    kills = [e for e in log if e[0] == "kill"]
    assert len(kills) == 1 and kills[0][1:2] == (1,) and kills[0][3] == KILL_AT_STEP, kills
    killed_at = kills[0][4]
    first, again = {}, {}
    for name, rank, pid, step, when in log:
        if name == "start":
            (first if when < killed_at else again)[rank] = (pid, step)
    assert sorted(first) == sorted(again) == [0, 1], log
    assert all(again[r][0] != first[r][0] for r in (0, 1)), (first, again)  # new processes
    assert [again[r][1] for r in (0, 1)] == [8, 8], again   # the newest step both had
    for rank in (0, 1):
        steps = [step for name, _, pid, step, _ in log
                 if name == "step" and pid == again[rank][0]]
        assert steps == list(range(9, ray_job.MAX_STEPS + 1)), (rank, steps)
    resumed = min(when for name, _, pid, _, when in log
                  if name == "step" and pid in (again[0][0], again[1][0]))
    # Two ways to the restart, and which comes first is Ray's timing, not towerlib's:
    # worker 0 (alive) raises towerlib's retryable error naming the lost worker, or Ray's
    # controller sees the dead actor first and stops worker 0 before it raises. Either way
    # no other error: no raw TensorFlow error reaches Ray.
    errors = worker_errors(ray_cluster)
    assert all("WorkerLostError: Worker 0:" in m and "worker task 1" in m
               and "no longer accepts connections" in m for m in errors), errors
    print(f"Ray Train restart: {resumed - killed_at:.1f} s from the kill to the first step "
          f"after resume; test {time.monotonic() - began:.0f} s", file=sys.stderr)

    # Bit-identical: every saved value (weights, the optimizer's slots, batch norm's
    # moving statistics, the global step) on both workers, against the run that went
    # through.
    reference = final_values(whole["train_dir"])
    assert "w1" in reference and len(reference) > 4, sorted(reference)
    for folder in ("", "worker_1"):
        for run in (whole, cut):
            values = final_values(os.path.join(run["train_dir"], folder))
            assert values.keys() == reference.keys(), (folder, sorted(values))
            for name, value in reference.items():
                np.testing.assert_array_equal(values[name], value, err_msg=f"{folder} {name}")

"""Ray Train with ScalingConfig(num_workers=(1, 2)): a lost node shrinks the job to the
worker that remains, a node given back grows it again, and the run ends with the weights
of a fixed 2-worker run.

What Ray Train V2 (ray 2.60) does, read in ray/train/v2/_internal/execution/
scaling_policy/elastic.py and controller/controller.py: at every (re)start the
ElasticScalingPolicy counts the workers the cluster's live nodes hold
(resources_per_worker against each node's total resources, as its
AutoscalingCoordinator last saw them: refreshed every 20 s), capped at max, and
starts that many if at least min; while the job runs it looks again every
elastic_resize_monitor_interval_s and, if the count changed, stops every worker
and starts the new count (no failure counted). A worker process killed on a node
that stays frees its resources: the restart is at the same size. So the job shrinks
when a node is lost, not when a process is.

One machine, several Ray nodes (ray.cluster_utils.Cluster: a head and two nodes,
each node one slot a worker needs), all on loopback (127.0.0.1, as
tests/cluster/test_ray_train.py pins it). The training function is
tests/cluster/ray_elastic_job.py: a global batch fixed by the step, whatever the
worker count. First a fixed 2-worker run, whose worker 1 SIGKILLs itself after step
10 (a same-size restart: the node stays). Then the elastic run: after its worker 1's
step 10 the test removes that worker's node; Ray restarts on the one worker left (a
TF_CONFIG of one worker), which trains alone and then waits; the test adds a node and
Ray grows the job back to 2 workers, which end at step 20. Every saved value of both
workers equals the fixed run's within 1e-5. The restart times are printed.

With towerlib.global_batch_input (skipped where towerlib has none yet) the workers
grown back resume from the chief's newest checkpoint, one the lone worker wrote;
with the function's own rows, from the newest one both workers have.
"""

import os
import secrets
import shutil
import sys
import tempfile
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

from tests.cluster import ray_elastic_job, ray_serial
from tests.cluster.progress_deadline import ProgressDeadline
from tests.cluster.test_ray_train import descendants, still_alive

pytestmark = [pytest.mark.slow, pytest.mark.one_ray_cluster,
              pytest.mark.filterwarnings("ignore::DeprecationWarning:ray\\.")]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MAX_STEPS = 20
# One fit, its restarts and resize included (449 s alone under load), may take as long as
# its workers keep writing events, at most STALL_SECS apart, within a cap.
STALL_SECS = 300
CAP_SECS = 2400
SHUTDOWN_BUDGET_SECS = 30
LOSE_AT_STEP = 10
SLOT = "towerlib_slot"     # one per Ray node that may hold a worker


class Nodes:
    """A Ray cluster of a head (no slot) and nodes of one slot each, on loopback."""

    def __init__(self, temp_dir):
        from ray.cluster_utils import Cluster
        self.cluster = Cluster(initialize_head=True, head_node_args=dict(
            num_cpus=1, node_ip_address="127.0.0.1", temp_dir=temp_dir,
            include_dashboard=False))
        self.add()
        self.add()

    def add(self):
        return self.cluster.add_node(num_cpus=1, resources={SLOT: 1},
                                     node_ip_address="127.0.0.1")

    def remove(self, node_id):
        (node,) = [n for n in self.cluster.worker_nodes if n.node_id == node_id]
        self.cluster.remove_node(node)


@pytest.fixture
def ray_nodes(monkeypatch):
    """The cluster above, connected; afterwards shut down with every process gone."""
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")   # loopback node address
    ray = pytest.importorskip(
        "ray", reason="ray cannot be imported: pip install -e '.[test]' brings ray[train]")
    from ray._private import ray_constants
    monkeypatch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", False)
    # Cluster() records its address in Ray's shared temporary folder for ray.init()
    # without an address; this test connects by address and writes nothing there.
    monkeypatch.setattr(ray._private.utils, "write_ray_address", lambda *a, **k: None)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        filter(None, [REPO, os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("RAY_AUTH_TOKEN", secrets.token_hex(16))
    monkeypatch.setenv("RAY_TRAIN_V2_ENABLED", "1")
    # A start that waits for a lost node's slot gives up after this, and Ray looks again.
    monkeypatch.setenv("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "20")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    held = ray_serial.one_ray_cluster_at_a_time()
    held.__enter__()   # released after the shutdown below, whatever happens
    temp_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    seen, nodes = {}, None
    try:
        nodes = Nodes(temp_dir)
        ray.init(address=nodes.cluster.address, configure_logging=False, log_to_driver=False)
        addresses = {node["NodeManagerAddress"] for node in ray.nodes()}
        assert addresses == {"127.0.0.1"}, f"a Ray node is not on loopback: {addresses}"
        yield nodes
    finally:
        seen.update(descendants())
        ray.shutdown()
        if nodes is not None:
            nodes.cluster.shutdown()
        deadline = time.monotonic() + SHUTDOWN_BUDGET_SECS
        while still_alive(seen) and time.monotonic() < deadline:
            time.sleep(0.25)
        shutil.rmtree(temp_dir, ignore_errors=True)
        held.__exit__(None, None, None)
    left = still_alive(seen)
    assert not left, f"processes of the Ray cluster left after its shutdown: {left}"


def fit(tmp_path, name, num_workers, job_input, **extra):
    """Starts one TensorflowTrainer.fit in a thread; returns (config, thread, outcome)."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.tensorflow import TensorflowTrainer

    os.makedirs(tmp_path / name)
    config = dict(train_dir=str(tmp_path / name / "train"), max_steps=MAX_STEPS,
                  events=str(tmp_path / name / "events.txt"), input=job_input, **extra)
    trainer = TensorflowTrainer(
        ray_elastic_job.train_loop, train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=num_workers, use_gpu=False,
                                     resources_per_worker={"CPU": 1, SLOT: 1},
                                     elastic_resize_monitor_interval_s=2.0),
        run_config=RunConfig(name=name, storage_path=str(tmp_path / "ray_results"),
                             failure_config=FailureConfig(max_failures=4)))
    outcome = {}

    def run():
        try:
            outcome["result"] = trainer.fit()
        except BaseException as error:  # noqa: BLE001 -- reported by finish()
            outcome["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return config, thread, outcome


def finish(thread, outcome, deadline):
    deadline.join(thread)
    assert not thread.is_alive(), f"trainer.fit(): {deadline.reason()}"
    assert "error" not in outcome, outcome.get("error")
    assert outcome["result"].error is None, outcome["result"].error


def events(config):
    """[(event, rank, pid, global_step, workers, node, time)] in the order written."""
    if not os.path.exists(config["events"]):
        return []
    with open(config["events"]) as text:
        return [(name, int(rank), int(pid), int(step), int(workers), node, float(when))
                for name, rank, pid, step, workers, node, when in
                (line.split() for line in text if line.endswith("\n"))]


def wait_for(condition, config, thread, deadline, what):
    """Polls the events until `condition(events)` is truthy (the fit still running)."""
    while True:
        found = condition(events(config))
        if found:
            return found
        assert thread.is_alive(), f"the fit ended before {what}"
        assert not deadline.passed(), f"no {what}: {deadline.reason()}"
        time.sleep(0.1)


def attempts(log):
    """[(workers, {rank: (pid, step restored from)})] per start of the worker group."""
    groups = []
    for name, rank, pid, step, workers, _, _ in log:
        if name != "start":
            continue
        if not groups or rank in groups[-1][1] or workers != groups[-1][0]:
            groups.append((workers, {}))
        groups[-1][1][rank] = (pid, step)
    return groups


def restart_secs(log, lost_at, group):
    """From `lost_at` to the first step of a process started in `group`."""
    pids = {pid for pid, _ in group[1].values()}
    return min(when for name, _, pid, _, _, _, when in log
               if name == "step" and pid in pids) - lost_at


def final_values(train_dir):
    reader = tf.train.load_checkpoint(os.path.join(train_dir, f"model.ckpt-{MAX_STEPS}"))
    return {name: reader.get_tensor(name)
            for name, dtype in reader.get_variable_to_dtype_map().items()
            if dtype not in (tf.string, tf.variant) and not name.startswith("global_batches")}


def test_a_lost_node_shrinks_the_ray_train_job_and_a_new_node_grows_it_back(
        ray_nodes, tmp_path):
    job_input = "global_batch"  # towerlib.global_batch_input: the topology-free input
    fixed, thread, outcome = fit(tmp_path, "fixed", 2, job_input, kill_rank=1,
                                 kill_at_step=LOSE_AT_STEP,
                                 kill_marker=str(tmp_path / "fixed" / "killed"))
    finish(thread, outcome, ProgressDeadline(fixed["events"], STALL_SECS, CAP_SECS))

    elastic, thread, outcome = fit(tmp_path, "elastic", (1, 2), job_input,
                                   hold_alone_at_step=LOSE_AT_STEP + 4, hold_secs=150)
    deadline = ProgressDeadline(elastic["events"], STALL_SECS, CAP_SECS)  # holds 150 s alone
    lost = wait_for(lambda log: [e for e in log if e[:2] == ("step", 1)
                                 and e[3] >= LOSE_AT_STEP], elastic, thread, deadline,
                    f"step {LOSE_AT_STEP} of worker 1")[0]
    node = [e[5] for e in events(elastic) if e[:3] == ("start", 1, lost[2])][0]
    ray_nodes.remove(node)
    lost_at = time.time()
    wait_for(lambda log: [e for e in log if e[0] == "start" and e[4] == 1], elastic,
             thread, deadline, "a start on one worker")
    ray_nodes.add()
    given_back_at = time.time()
    finish(thread, outcome, deadline)
    log = events(elastic)

    # 2 workers, then the one left after the node was lost, then 2 again.
    groups = attempts(log)
    sizes = [workers for workers, _ in groups]
    assert sizes[0] == 2 and sizes[-1] == 2 and 1 in sizes, groups
    alone = groups[sizes.index(1)]
    assert sorted(alone[1]) == [0], alone
    alone_steps = [e[3] for e in log if e[0] == "step" and e[2] == alone[1][0][0]]
    assert alone_steps and min(alone_steps) > alone[1][0][1], alone_steps   # it trained
    regrown = groups[-1]
    assert sorted(regrown[1]) == [0, 1] and all(
        pid not in {p for _, g in groups[:-1] for p, _ in g.values()}
        for pid, _ in regrown[1].values()), groups      # new processes
    steps = [e[3] for e in log if e[0] == "step" and e[2] == regrown[1][0][0]]
    assert max(steps) == MAX_STEPS, steps
    if job_input == "global_batch":   # from the chief's newest: the lone worker's steps kept
        assert regrown[1][0][1] > LOSE_AT_STEP, groups

    reference = final_values(fixed["train_dir"])
    assert "w1" in reference and "w1/Momentum" in reference, sorted(reference)
    for folder in ("", "worker_1"):
        values = final_values(os.path.join(elastic["train_dir"], folder))
        assert values.keys() == reference.keys(), (folder, sorted(values))
        for name, value in reference.items():
            np.testing.assert_allclose(values[name], value, rtol=0, atol=1e-5,
                                       err_msg=f"'{folder}' {name}")

    fixed_log = events(fixed)
    killed_at = [e[6] for e in fixed_log if e[0] == "kill"][0]
    print(f"\nRay Train elastic ({job_input}): node lost -> first step on 1 worker "
          f"{restart_secs(log, lost_at, alone):.1f} s; node given back -> first step on "
          f"2 workers {restart_secs(log, given_back_at, regrown):.1f} s (resumed from "
          f"step {regrown[1][0][1]}); same-size restart after a SIGKILL "
          f"{restart_secs(fixed_log, killed_at, attempts(fixed_log)[-1]):.1f} s",
          file=sys.stderr)

"""Multi-worker synchronous training on TensorFlow's own gRPC runtime.

A cluster has parameter-server tasks ('ps'), which hold the variables, and
replica tasks ('worker', plus an optional 'chief' job from TF_CONFIG), each
running its local towers exactly as on one machine. One global step works
like this:

    replica r: towers on /job:worker/task:r/device:CPU:i (or GPU:i)
               -> its gradient g_r = sum_i (n_i / n_r) grad_i   (build_train_graph)
               -> pushed into one ConditionalAccumulator per variable, on the
                  variable's ps task, tagged with the replica's local step
    chief:     takes the mean of the R pushed gradients, (1/R) sum_r g_r,
               applies it once, global_step += 1, hands out R tokens
    replicas:  wait for a token, then start the next step.

That is `tf.compat.v1.train.SyncReplicasOptimizer` with
replicas_to_aggregate = total_num_replicas = R. With equal replica batches
n_r = B / R the update is sum_r (n_r / B) g_r, the mean gradient over the
global batch of B examples: the same step one process would take with every
tower. (Unequal replica batches weight each replica equally, not each
example; see docs/distributed.md.)

Three departures from the stock SyncReplicasOptimizer recipe, for exactness
and a clean end (see `SyncReplicasTowerOptimizer`): the chief runs the
aggregation inside its own training step instead of in a background
queue-runner thread, no tokens are handed out before the first step, and the
batch-norm updates stay off the synchronization ops.

A ps task exits once every replica has reported done (`run_parameter_server`),
instead of blocking in server.join() forever.

Library code reads no flags: scripts pass flag values to `cluster_from_flags`
or let `resolve_cluster` fall back to the TF_CONFIG environment variable.
"""

import dataclasses
import json
import logging
import os
import socket
import time
from typing import Any, Dict, Tuple

import tensorflow as tf

from towerlib import devices as devices_lib
from towerlib import train_graph as train_graph_lib
from towerlib import trainer as trainer_lib
from towerlib.internals import sync_replicas as sync_internals

logger = logging.getLogger("towerlib")

PS_JOB = "ps"
WORKER_JOB = "worker"
CHIEF_JOB = "chief"
KNOWN_JOBS = (PS_JOB, WORKER_JOB, CHIEF_JOB)

# The queue each ps task waits on until every replica reports it is done.
_DONE_QUEUE_NAME = "towerlib_replicas_done"


# --------------------------------------------------------------------------
# Cluster description
# --------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ClusterInfo:
    """Which cluster this process belongs to and which task it is.

    Attributes:
      jobs: job name -> tuple of 'host:port' addresses, e.g.
        {'ps': ('127.0.0.1:2222',), 'worker': ('127.0.0.1:2223', ...)}.
        Jobs are 'ps', 'worker' and optionally 'chief' (TF_CONFIG style).
      job_name: this task's job.
      task_index: this task's index within its job.
    """

    jobs: Dict[str, Tuple[str, ...]]
    job_name: str
    task_index: int

    @property
    def cluster_spec(self):
        """The tf.train.ClusterSpec of the whole cluster."""
        return tf.train.ClusterSpec({job: list(hosts) for job, hosts in self.jobs.items()})

    @property
    def num_ps(self):
        return len(self.jobs.get(PS_JOB, ()))

    @property
    def replica_jobs(self):
        """The jobs whose tasks train: ('chief', 'worker') or ('worker',)."""
        return tuple(job for job in (CHIEF_JOB, WORKER_JOB) if self.jobs.get(job))

    @property
    def num_replicas(self):
        """R: how many tasks train, each on its own share of the global batch."""
        return sum(len(self.jobs[job]) for job in self.replica_jobs)

    @property
    def is_ps(self):
        return self.job_name == PS_JOB

    @property
    def is_chief(self):
        """The chief initializes, checkpoints and writes summaries.

        It is the 'chief' task when there is one, else worker 0.
        """
        if CHIEF_JOB in self.jobs and self.jobs[CHIEF_JOB]:
            return self.job_name == CHIEF_JOB
        return self.job_name == WORKER_JOB and self.task_index == 0

    @property
    def replica_index(self):
        """0..R-1 over the training tasks (chief first): which data shard is ours."""
        if self.is_ps:
            raise ValueError("A ps task is not a replica: it holds variables, "
                             "it does not train.")
        if self.job_name == CHIEF_JOB:
            return 0
        return self.task_index + len(self.jobs.get(CHIEF_JOB, ()))

    @property
    def task_device(self):
        """'/job:worker/task:1': the device prefix of this task's ops."""
        return f"/job:{self.job_name}/task:{self.task_index}"

    @property
    def ps_devices(self):
        return [f"/job:{PS_JOB}/task:{i}/device:CPU:0" for i in range(self.num_ps)]


def parse_host_list(text, what):
    """'h1:p1,h2:p2' -> ('h1:p1', 'h2:p2'), each address validated.

    Args:
      text: comma-separated addresses (a list or tuple is accepted too).
      what: where the list came from, for error messages ('--ps_hosts').
    """
    if isinstance(text, (list, tuple)):
        items = [str(item).strip() for item in text]
    else:
        items = [item.strip() for item in str(text or "").split(",")]
        if items == [""]:
            return ()
    for address in items:
        host, sep, port = address.rpartition(":")
        if not address or not sep or not host:
            raise ValueError(
                f"{what}: {address!r} is not a 'host:port' address. Write e.g. "
                f"{what}=127.0.0.1:2222,127.0.0.1:2223 (no spaces inside an address, "
                "no empty entries).")
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(
                f"{what}: {address!r} has port {port!r}; a port is an integer in "
                "1..65535.")
    return tuple(items)


def _validated(jobs, job_name, task_index, source):
    """A ClusterInfo after checking that the description is usable."""
    unknown = sorted(set(jobs) - set(KNOWN_JOBS))
    if unknown:
        raise ValueError(
            f"{source}: unknown job(s) {unknown}. towerlib knows 'ps' (variables), "
            "'worker' and 'chief' (training replicas).")
    jobs = {job: hosts for job, hosts in jobs.items() if hosts}
    if not jobs.get(PS_JOB):
        raise ValueError(
            f"{source}: the cluster has no 'ps' task. Variables live on parameter "
            "servers: give at least one ps address (--ps_hosts).")
    if not jobs.get(WORKER_JOB) and not jobs.get(CHIEF_JOB):
        raise ValueError(
            f"{source}: the cluster has no 'worker' task. Give at least one worker "
            "address (--worker_hosts).")
    if len(jobs.get(CHIEF_JOB, ())) > 1:
        raise ValueError(
            f"{source}: the 'chief' job has {len(jobs[CHIEF_JOB])} tasks; it has "
            "exactly one (the other training tasks belong in 'worker').")
    seen = {}
    for job, hosts in jobs.items():
        for index, address in enumerate(hosts):
            if address in seen:
                raise ValueError(
                    f"{source}: address {address} is given to both "
                    f"{seen[address]} and {job}:{index}; every task needs its own "
                    "port.")
            seen[address] = f"{job}:{index}"
    if job_name not in jobs:
        raise ValueError(
            f"{source}: this task's job {job_name!r} is not in the cluster "
            f"(jobs: {sorted(jobs)}). Use --job_name=ps or --job_name=worker.")
    if isinstance(task_index, bool) or not isinstance(task_index, int):
        raise TypeError(f"{source}: task index must be an int, got {task_index!r}.")
    if not 0 <= task_index < len(jobs[job_name]):
        raise ValueError(
            f"{source}: task index {task_index} is out of range for job "
            f"{job_name!r}, which has {len(jobs[job_name])} task(s) "
            f"(valid: 0..{len(jobs[job_name]) - 1}).")
    return ClusterInfo(jobs=dict(jobs), job_name=job_name, task_index=task_index)


def cluster_from_flags(ps_hosts="", worker_hosts="", job_name="", task_index=0):
    """The cluster from --ps_hosts/--worker_hosts/--job_name/--task_index values.

    Worker 0 is the chief. Returns None when all of ps_hosts, worker_hosts and
    job_name are empty (a one-machine run).

    Raises:
      ValueError: naming the flag that is missing or malformed.
    """
    ps = parse_host_list(ps_hosts, "--ps_hosts")
    workers = parse_host_list(worker_hosts, "--worker_hosts")
    if not ps and not workers and not job_name:
        return None
    missing = [name for name, value in (("--ps_hosts", ps), ("--worker_hosts", workers),
                                        ("--job_name", job_name)) if not value]
    if missing:
        raise ValueError(
            f"Distributed training needs --ps_hosts, --worker_hosts and --job_name "
            f"together; missing: {', '.join(missing)}. Leave all of them empty to "
            "train on one machine.")
    if job_name not in (PS_JOB, WORKER_JOB):
        raise ValueError(
            f"--job_name={job_name!r}: use 'ps' or 'worker' (worker 0 is the chief).")
    return _validated({PS_JOB: ps, WORKER_JOB: workers}, job_name, task_index,
                      "cluster flags")


def cluster_from_tf_config(tf_config):
    """The cluster from a TF_CONFIG value (a JSON string or an already parsed dict).

    TF_CONFIG looks like
      {"cluster": {"ps": ["h:p"], "worker": ["h:p", "h:p"], "chief": ["h:p"]},
       "task": {"type": "worker", "index": 0}}
    ("chief" is optional; without it worker 0 is the chief). Returns None for an
    empty value or one without a "cluster".
    """
    if not tf_config:
        return None
    if isinstance(tf_config, str):
        try:
            tf_config = json.loads(tf_config)
        except json.JSONDecodeError as error:
            raise ValueError(f"TF_CONFIG is not valid JSON ({error}): "
                             f"{tf_config[:200]!r}") from error
    if not isinstance(tf_config, dict):
        raise ValueError(f"TF_CONFIG must be a JSON object, got {type(tf_config).__name__}.")
    cluster = tf_config.get("cluster")
    if not cluster:
        return None
    if not isinstance(cluster, dict):
        raise ValueError('TF_CONFIG "cluster" must map job names to address lists.')
    task = tf_config.get("task")
    if not isinstance(task, dict) or "type" not in task:
        raise ValueError(
            'TF_CONFIG has a "cluster" but no "task": add '
            '"task": {"type": "worker", "index": 0} for this process.')
    if task["type"] == "evaluator":
        raise ValueError(
            "TF_CONFIG task type 'evaluator' does not train; run evaluation as a "
            "separate one-machine job on the checkpoints in train_dir.")
    jobs = {job: parse_host_list(hosts, f"TF_CONFIG cluster.{job}")
            for job, hosts in cluster.items()}
    return _validated(jobs, task["type"], task.get("index", 0), "TF_CONFIG")


def resolve_cluster(ps_hosts="", worker_hosts="", job_name="", task_index=0,
                    environ=None):
    """The cluster from flag values, else from TF_CONFIG; None on one machine.

    Args:
      ps_hosts, worker_hosts, job_name, task_index: the flag values.
      environ: the environment to read TF_CONFIG from (default os.environ).

    Raises:
      ValueError: when both the flags and TF_CONFIG describe a cluster (which
        one is meant would be a guess), or either is malformed.
    """
    environ = os.environ if environ is None else environ
    from_flags = cluster_from_flags(ps_hosts, worker_hosts, job_name, task_index)
    from_env = cluster_from_tf_config(environ.get("TF_CONFIG", ""))
    if from_flags is not None and from_env is not None:
        raise ValueError(
            "Both the cluster flags and TF_CONFIG describe a cluster. Use one: "
            "unset TF_CONFIG, or leave --ps_hosts/--worker_hosts/--job_name empty.")
    return from_flags if from_flags is not None else from_env


# --------------------------------------------------------------------------
# Servers, sessions and devices
# --------------------------------------------------------------------------

def session_config(cluster, num_towers=1, base_config=None):
    """The ConfigProto for this task's server and sessions.

    A replica gets towerlib.session_config(num_towers) (virtual CPU devices
    for CPU towers) and device_filters that let it talk only to the ps tasks
    and itself: replicas never exchange tensors directly, and a replica that
    is down must not stall the others' session creation.
    """
    if cluster.is_ps:
        config = tf.compat.v1.ConfigProto()
        if base_config is not None:
            config.CopyFrom(base_config)
        config.device_filters[:] = [cluster.task_device]
        return config
    config = devices_lib.session_config(num_towers, base_config=base_config)
    config.device_filters[:] = [f"/job:{PS_JOB}", cluster.task_device]
    return config


def start_server(cluster, num_towers=1, base_config=None):
    """Starts this task's gRPC server (tf.distribute.Server).

    The server, not the session, owns the task's devices, so a replica's
    virtual CPU devices for CPU towers are asked for here.
    """
    return tf.distribute.Server(
        cluster.cluster_spec, job_name=cluster.job_name, task_index=cluster.task_index,
        config=session_config(cluster, num_towers, base_config), protocol="grpc",
        start=True)


def tower_devices(cluster, num_towers=None, device_type=None):
    """This replica's tower devices: ['/job:worker/task:1/device:CPU:0', ...].

    Same arguments as towerlib.tower_devices, which looks at this machine.
    """
    task = tf.DeviceSpec.from_string(cluster.task_device)
    return [task.make_merged_spec(tf.DeviceSpec.from_string(local)).to_string()
            for local in devices_lib.tower_devices(num_towers, device_type)]


class ParameterServerPlacer:
    """Device function: variables to the ps tasks by byte size, the rest here.

    Each new variable goes to the ps task holding the fewest bytes so far, so
    one large dense layer does not share a task with everything else. Every
    other op goes to this replica's task (merged with what the op asked for).
    A variable that already names a job keeps it: an inner tf.device wins, and
    a second pass of this function (towerlib's tower scope calls it, then the
    enclosing scope does) changes nothing and counts nothing twice.

    Optimizer slots follow their variable (TF colocates them), so they are
    not counted; they grow every task's load in proportion.
    """

    def __init__(self, cluster):
        if cluster.num_ps < 1:
            raise ValueError("ParameterServerPlacer needs a cluster with a ps task.")
        self.ps_devices = cluster.ps_devices
        self._ps_placer = devices_lib.GreedyVariablePlacer(self.ps_devices)
        self.replica_device = tf.DeviceSpec.from_string(cluster.task_device)

    def __call__(self, op):
        requested = tf.DeviceSpec.from_string(op.device or "")
        if op.type in devices_lib.VARIABLE_OP_TYPES:
            if requested.job:
                return requested.to_string()
            return self._ps_placer(op)
        return self.replica_device.make_merged_spec(requested).to_string()

    @property
    def bytes_per_task(self):
        """Bytes of variables placed so far on each ps task."""
        return list(self._ps_placer.bytes_per_device)


# --------------------------------------------------------------------------
# Synchronous replicas
# --------------------------------------------------------------------------

class SyncReplicasTowerOptimizer(tf.compat.v1.train.SyncReplicasOptimizer):
    """SyncReplicasOptimizer over R replicas, fitted to towerlib's train step.

    Each replica pushes its tower-aggregated gradient; the chief averages R of
    them per variable (ConditionalAccumulator.take_grad divides the sum by the
    number accumulated) and applies the mean once. Differences from the stock
    optimizer and hook:

    - The chief's own training step also runs the aggregation (take the mean,
      apply, hand out the next tokens). The stock recipe runs it in a queue
      runner thread, which is left blocked in take_grad after the last step,
      so MonitoredTrainingSession's close waits out its 120 s grace period.
    - No tokens are handed out before the first step (num_tokens=0). The stock
      default gives R, which lets a fast replica push twice for step 0 and
      fill the accumulator without the others.
    - Control dependencies of the caller (build_train_graph puts the chosen
      batch-norm updates there) go on this replica's step only, never on the
      accumulators, the apply or the local-step initializer; otherwise the
      initializers would also run a forward pass and a moving-average update.
    - With `variable_averages`, the moving average of the weights is updated
      once per global step, by the chief, after the apply.
    """

    def __init__(self, optimizer, num_replicas, is_chief, variable_averages=None):
        super().__init__(optimizer, replicas_to_aggregate=num_replicas,
                         total_num_replicas=num_replicas,
                         variable_averages=variable_averages,
                         variables_to_average=[] if variable_averages else None)
        self.num_replicas = num_replicas
        self.is_chief = is_chief
        self.variable_averages = variable_averages
        self.replica_step_op = None
        self.aggregation_op = None

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        grads_and_vars = list(grads_and_vars)
        caller_dependencies = tf.no_op(name="caller_control_dependencies").control_inputs
        if self.variable_averages is not None:
            sync_internals.set_variables_to_average(
                self, [v for g, v in grads_and_vars if g is not None])
        with tf.control_dependencies(None):
            self.replica_step_op = super().apply_gradients(grads_and_vars, global_step, name)
            self.aggregation_op = sync_internals.chief_aggregation_op(self)
        # Run by SyncReplicasInitHook; marked so graphs built but never run stay quiet.
        sync_internals.mark_ready_for_local_init_op_used(self)
        parts = [self.replica_step_op]
        if self.is_chief:
            parts.append(self.aggregation_op)
        with tf.control_dependencies(caller_dependencies):
            return tf.group(*parts, name="sync_replicas_step")

    def make_session_run_hook(self, is_chief=None, num_tokens=0):
        """The SyncReplicasInitHook for this replica (built for chief or not)."""
        if is_chief is not None and is_chief != self.is_chief:
            raise ValueError(
                f"This optimizer was built for a {'chief' if self.is_chief else 'non-chief'} "
                "replica (the chief's step also aggregates); build the graph with "
                "the right cluster instead of overriding is_chief.")
        if num_tokens != 0:
            raise ValueError(
                "SyncReplicasTowerOptimizer hands out no tokens before the first "
                "step (num_tokens=0); extra tokens let one replica push twice per "
                "step.")
        return SyncReplicasInitHook(self, self.is_chief)


class SyncReplicasInitHook(tf.compat.v1.train.SessionRunHook):
    """Initializes a replica's synchronization state when its session starts.

    Every replica sets its local step to the global step; the chief also sets
    each accumulator's step, so gradients computed on older weights are
    dropped as stale. No queue-runner thread (see SyncReplicasTowerOptimizer).
    """

    def __init__(self, sync_optimizer, is_chief):
        self._sync_optimizer = sync_optimizer
        self._is_chief = is_chief

    def begin(self):
        if not sync_internals.gradients_applied(self._sync_optimizer):
            raise ValueError("Build the train op (apply_gradients) before creating "
                             "the session.")
        self._local_init_op = (self._sync_optimizer.chief_init_op if self._is_chief
                               else self._sync_optimizer.local_step_init_op)

    def after_create_session(self, session, coord):
        uninitialized = session.run(self._sync_optimizer.ready_for_local_init_op)
        if len(uninitialized):
            raise RuntimeError(
                "Variables are still uninitialized after session creation: "
                f"{[n.decode() for n in uninitialized][:5]}. The chief must "
                "initialize (or restore) them before replicas start.")
        session.run(self._local_init_op)


@dataclasses.dataclass
class SyncTrainGraph:
    """A replica's training graph and what running it needs.

    Attributes:
      train_graph: the towerlib TrainGraph; its train_op is one synchronous
        step (the chief's also aggregates and applies the global update).
      optimizer: the SyncReplicasTowerOptimizer.
      hooks: session hooks to run with it (the synchronization init hook).
      cluster: the ClusterInfo it was built for.
      session_config: the ConfigProto for this replica's sessions.
      device_function: the ParameterServerPlacer used for the variables.
    """

    train_graph: train_graph_lib.TrainGraph
    optimizer: SyncReplicasTowerOptimizer
    hooks: Tuple[Any, ...]
    cluster: ClusterInfo
    session_config: Any
    device_function: ParameterServerPlacer


def check_bn_mode_for_cluster(bn_mode, cluster):
    """bn_mode='sync' all-reduces within one replica only, so it cannot span R > 1."""
    if bn_mode == "sync" and cluster.num_replicas > 1:
        raise ValueError(
            f"bn_mode='sync' cannot span the {cluster.num_replicas} workers of this "
            "cluster: its all-reduce runs among one worker's towers only, so each "
            "worker would normalize with its own shard of the global batch, not "
            "the whole batch. Use bn_mode='all_towers' (each worker normalizes per "
            "tower and updates the moving statistics from its whole worker batch) "
            "or 'first_tower'.")


_RESERVED_BUILD_ARGS = ("devices", "param_device", "ema_decay", "num_towers")


def build_sync_train_graph(tower_fn, inputs, optimizer, cluster, *, num_towers=None,
                           device_type=None, bn_mode="first_tower", ema_decay=None,
                           device_function=None, **build_kwargs):
    """Builds this replica's synchronous training step.

    Call it in every replica with the same model, optimizer and arguments;
    `inputs` is this replica's own part of the global batch (say, rows
    [r * B / R, (r + 1) * B / R) for replica r = cluster.replica_index).
    Build the inputs (and the global step, if they read it) under
    `tf.compat.v1.device(placer)` with `placer = ParameterServerPlacer(cluster)`
    passed here as `device_function`, so that input ops run on this replica
    and any variable lands on a ps task.

    Args:
      tower_fn, inputs: as for towerlib.build_train_graph.
      optimizer: a tf.compat.v1.train.Optimizer (e.g. GradientDescentOptimizer);
        it is wrapped here, do not wrap it in SyncReplicasOptimizer yourself.
      cluster: this task's ClusterInfo (a replica, not a ps).
      num_towers, device_type: this replica's towers, as for towerlib.tower_devices.
      bn_mode: 'first_tower' or 'all_towers' (per replica; see docs/distributed.md).
        'sync' raises when the cluster has more than one replica.
      ema_decay: keep an ExponentialMovingAverage of the weights, updated once
        per global step by the chief.
      device_function: the ParameterServerPlacer the inputs were built under
        (default: a new one).
      **build_kwargs: other towerlib.build_train_graph arguments (learning_rate,
        var_list, summaries, global_step).

    Returns:
      A SyncTrainGraph.
    """
    if cluster is None or cluster.is_ps:
        raise ValueError(
            "build_sync_train_graph runs on a training task (worker or chief); a ps "
            "task only serves variables (run_parameter_server).")
    check_bn_mode_for_cluster(bn_mode, cluster)
    reserved = sorted(set(build_kwargs) & set(_RESERVED_BUILD_ARGS))
    if reserved:
        raise ValueError(f"{reserved} are set by build_sync_train_graph from the "
                         "cluster; pass num_towers/device_type/ema_decay as its own "
                         "arguments.")
    if isinstance(optimizer, tf.compat.v1.train.SyncReplicasOptimizer):
        raise TypeError("Pass the plain optimizer; build_sync_train_graph wraps it "
                        "in SyncReplicasTowerOptimizer itself.")
    placer = device_function or ParameterServerPlacer(cluster)
    devices = tower_devices(cluster, num_towers, device_type)
    with tf.compat.v1.device(placer):
        global_step = build_kwargs.pop("global_step", None)
        if global_step is None:
            global_step = tf.compat.v1.train.get_or_create_global_step()
        ema = None
        if ema_decay is not None:
            train_graph_lib.check_ema_decay(ema_decay)
            ema = tf.compat.v1.train.ExponentialMovingAverage(
                ema_decay, num_updates=global_step)
        sync_optimizer = SyncReplicasTowerOptimizer(
            optimizer, cluster.num_replicas, cluster.is_chief, variable_averages=ema)
        train_graph = train_graph_lib.build_train_graph(
            tower_fn, inputs, sync_optimizer, devices=devices, bn_mode=bn_mode,
            param_device=placer, global_step=global_step, **build_kwargs)
    if ema is not None:
        train_graph = dataclasses.replace(train_graph, ema=ema)
    return SyncTrainGraph(
        train_graph=train_graph, optimizer=sync_optimizer,
        hooks=(sync_optimizer.make_session_run_hook(),), cluster=cluster,
        session_config=session_config(cluster, len(devices)), device_function=placer)


# --------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------

def _done_queue(ps_task, capacity=1024):
    """The queue on ps task `ps_task` that replicas put their index in when done."""
    with tf.device(f"/job:{PS_JOB}/task:{ps_task}/device:CPU:0"):
        return tf.queue.FIFOQueue(capacity, [tf.int32], shapes=[[]],
                                  shared_name=f"{_DONE_QUEUE_NAME}_{ps_task}",
                                  name=f"{_DONE_QUEUE_NAME}_{ps_task}")


def wait_for_ps_tasks(cluster, timeout_secs=600.0, poll_secs=0.5):
    """Blocks until every ps task accepts TCP connections on its port.

    TensorFlow's session creation waits for unreachable tasks forever (no
    RunOptions or ConfigProto timeout reaches it), so replicas check first.

    Raises:
      TimeoutError: naming the ps tasks still unreachable after timeout_secs.
    """
    deadline = time.time() + timeout_secs
    waiting = dict(enumerate(cluster.jobs[PS_JOB]))
    while True:
        for index, address in list(waiting.items()):
            host, _, port = address.rpartition(":")
            try:
                with socket.create_connection((host.strip("[]"), int(port)),
                                              timeout=max(poll_secs, 0.1)):
                    del waiting[index]
            except OSError:
                pass
        if not waiting:
            return
        if time.time() > deadline:
            described = ", ".join(f"ps task {i} at {a}" for i, a in waiting.items())
            raise TimeoutError(
                f"{described} did not answer within {timeout_secs:.0f} s. Start "
                "it (--job_name=ps), or fix the ps addresses (--ps_hosts / TF_CONFIG).")
        time.sleep(poll_secs)


class ControlSession:
    """A small session of one replica beside its training session.

    Opened (and used once) before training, it waits for the chief's
    initialization and, after training, tells the ps tasks this replica is
    done. It is never opened after the training session has closed: a new
    gRPC session created right then crashed the chief once (a segfault inside
    TensorFlow). Build it before the training session finalizes the graph.

    Args:
      cluster: this replica's ClusterInfo.
      target: its server's target.
      config: its session config (sync_graph.session_config).
    """

    def __init__(self, cluster, target, config):
        self.cluster = cluster
        with tf.name_scope("control"):
            self._uninitialized = tf.compat.v1.report_uninitialized_variables(
                tf.compat.v1.global_variables())
            with tf.control_dependencies(None):
                self._report_done = tf.group(*[
                    _done_queue(i).enqueue(cluster.replica_index)
                    for i in range(cluster.num_ps)])
        self._session = tf.compat.v1.Session(target, config=config)

    def uninitialized_variables(self, timeout_secs=10.0):
        """Names of the global variables nobody has initialized yet."""
        options = tf.compat.v1.RunOptions(timeout_in_ms=int(timeout_secs * 1000))
        return self._session.run(self._uninitialized, options=options)

    def wait_for_chief(self, timeout_secs=600.0, poll_secs=0.5):
        """Blocks until the chief has initialized (or restored) every global variable.

        MonitoredTrainingSession makes a non-chief wait too, but polls every
        30 s; this polls every `poll_secs`.

        Raises:
          TimeoutError: when the chief has not initialized within timeout_secs.
        """
        deadline = time.time() + timeout_secs
        while True:
            try:
                if not len(self.uninitialized_variables()):
                    return
            except (tf.errors.UnavailableError, tf.errors.DeadlineExceededError,
                    tf.errors.AbortedError):
                pass
            if time.time() > deadline:
                raise TimeoutError(
                    f"The chief has not initialized the model after {timeout_secs:.0f} s. "
                    "Is the chief running, and can this task reach every ps task?")
            time.sleep(poll_secs)

    def report_done(self, timeout_secs=60.0):
        """Tells every ps task this replica has finished (see run_parameter_server)."""
        options = tf.compat.v1.RunOptions(timeout_in_ms=int(timeout_secs * 1000))
        try:
            self._session.run(self._report_done, options=options)
        except tf.errors.OpError as error:
            logger.warning("Could not tell the ps tasks that replica %d is done (%s); "
                           "stop them by hand.", self.cluster.replica_index,
                           error.message)

    def close(self):
        self._session.close()


def run_distributed_training(sync_graph, server, *, train_dir, max_steps, hooks=(),
                             startup_timeout_secs=600.0, report_done=True,
                             **run_kwargs):
    """Runs this replica's training until global_step reaches max_steps.

    The chief initializes or restores from the latest checkpoint in train_dir,
    and alone writes checkpoints and summaries there (train_dir must be on a
    file system every ps task can write: the checkpoint is sharded per ps).
    Other replicas wait for it, then join; a restarted replica rejoins the same
    way. When training has ended normally, final checkpoint included, each
    replica tells the ps tasks it is done (`report_done`), so that
    `run_parameter_server` can return.

    Args:
      sync_graph: from build_sync_train_graph.
      server: this task's server (start_server).
      train_dir, max_steps, hooks, **run_kwargs: as for towerlib.run_training.
      startup_timeout_secs: how long to wait for the ps tasks to answer and,
        on a non-chief, for the chief to initialize; then TimeoutError.
      report_done: tell the ps tasks when done.

    Returns:
      What towerlib.run_training returns: (global_step, loss) after the last
      step this replica ran.
    """
    cluster = sync_graph.cluster
    with sync_graph.train_graph.train_op.graph.as_default():
        control = ControlSession(cluster, server.target, sync_graph.session_config)
    try:
        started = time.time()
        wait_for_ps_tasks(cluster, startup_timeout_secs)
        if cluster.is_chief:
            try:
                control.uninitialized_variables()  # opens the session before training
            except (tf.errors.DeadlineExceededError, tf.errors.UnavailableError) as error:
                logger.warning("The control session did not open before training "
                               "(%s); it will when reporting done.", error.message)
        else:
            control.wait_for_chief(max(startup_timeout_secs - (time.time() - started), 1.0))
        result = trainer_lib.run_training(
            sync_graph.train_graph, train_dir=train_dir, max_steps=max_steps,
            hooks=list(sync_graph.hooks) + list(hooks),
            session_config=sync_graph.session_config, master=server.target,
            is_chief=cluster.is_chief, **run_kwargs)
        if report_done:
            control.report_done()
        return result
    finally:
        control.close()


def run_parameter_server(cluster, server=None, timeout_secs=None):
    """Serves this ps task's variables until every replica reports done.

    Unlike server.join(), this returns once each of the R replicas has
    finished (run_distributed_training reports it), so the whole cluster
    exits on its own. A replica that crashes and is restarted reports once,
    when its new incarnation finishes.

    Args:
      cluster: a ps task's ClusterInfo.
      server: its started server (default: start one).
      timeout_secs: give up after this long (None: wait as long as it takes).

    Raises:
      TimeoutError: when the replicas have not all finished in timeout_secs.
    """
    if not cluster.is_ps:
        raise ValueError(f"run_parameter_server runs on a ps task, not "
                         f"{cluster.task_device}.")
    server = server or start_server(cluster)
    with tf.Graph().as_default():
        dequeue = _done_queue(cluster.task_index).dequeue()
        config = tf.compat.v1.ConfigProto(device_filters=[cluster.task_device])
        options = tf.compat.v1.RunOptions(
            timeout_in_ms=int(timeout_secs * 1000) if timeout_secs else 0)
        deadline = time.time() + timeout_secs if timeout_secs else None
        with tf.compat.v1.Session(server.target, config=config) as session:
            for done in range(1, cluster.num_replicas + 1):
                if deadline is not None:
                    remaining = deadline - time.time()
                    options.timeout_in_ms = max(1, int(remaining * 1000))
                try:
                    replica = session.run(dequeue, options=options)
                except tf.errors.DeadlineExceededError as error:
                    raise TimeoutError(
                        f"ps task {cluster.task_index}: only {done - 1} of "
                        f"{cluster.num_replicas} replicas finished within "
                        f"{timeout_secs} s.") from error
                logger.info("ps task %d: replica %d done (%d of %d).",
                            cluster.task_index, replica, done, cluster.num_replicas)
    return server

"""A replica's synchronous training step: R replicas, one update per global step.

One global step works like this:

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
batch-norm updates stay off the synchronization ops. What that needs from
the stock optimizer's internals is in towerlib.internals.sync_replicas.
"""

import dataclasses
from typing import Any, Tuple

import tensorflow as tf

from towerlib.batchnorm.modes import resolve_bn_mode
from towerlib.cluster import allreduce_job, placement
from towerlib.cluster.spec import ClusterInfo, check_cluster
from towerlib.internals import deprecations
from towerlib.internals import sync_replicas as sync_internals
from towerlib.run import global_batches
from towerlib.step.build import build_train_graph
from towerlib.step.options import STEP_OPTIONS, check_ema_decay
from towerlib.step.train_graph import TrainGraph
from towerlib.update.choice import resolve_update
from towerlib.update.parameter_server import ParameterServer


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
        with deprecations.silenced():  # TF's own synchronous replicas, chosen on purpose
            super().__init__(optimizer, replicas_to_aggregate=num_replicas,
                             total_num_replicas=num_replicas,
                             variable_averages=variable_averages,
                             variables_to_average=[] if variable_averages else None)
        self.num_replicas = num_replicas
        self.is_chief = is_chief
        self.variable_averages = variable_averages
        self.wrapped_optimizer = optimizer  # towerlib.precision.guards.guards_in looks inside
        self.replica_step_op = None
        self.aggregation_op = None

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        grads_and_vars = list(grads_and_vars)
        caller_dependencies = tf.no_op(name="caller_control_dependencies").control_inputs
        if self.variable_averages is not None:
            sync_internals.set_variables_to_average(
                self, [v for g, v in grads_and_vars if g is not None])
        with tf.control_dependencies(None):
            with deprecations.silenced():  # its QueueRunner
                self.replica_step_op = super().apply_gradients(
                    grads_and_vars, global_step, name)
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
        step (the chief's also aggregates and applies the global update). Its
        fields (loss, tower_shares, ...) read through this object too.
      optimizer: the SyncReplicasTowerOptimizer.
      hooks: session hooks to run with it (the synchronization init hook).
      cluster: the ClusterInfo it was built for.
      session_config: the ConfigProto for this replica's sessions.
      device_function: the ParameterServerPlacer used for the variables.
    """

    train_graph: TrainGraph
    optimizer: SyncReplicasTowerOptimizer
    hooks: Tuple[Any, ...]
    cluster: ClusterInfo
    session_config: Any
    device_function: placement.ParameterServerPlacer

    def __getattr__(self, name):
        # TrainGraph's fields (loss, tower_shares, train_op...) read through, so a hook
        # written for one machine's TrainGraph works with either update.
        if name.startswith("__") or name == "train_graph":
            raise AttributeError(name)
        return getattr(self.train_graph, name)


def check_bn_mode_for_cluster(bn_mode, cluster):
    """bn_mode='sync' all-reduces within one replica only, so it cannot span R > 1."""
    resolve_bn_mode(bn_mode).check_replicas(cluster.num_replicas)


# build_train_graph's options but those the cluster decides (the towers' devices, the
# worker group); `update` defaults to the ps tasks.
SYNC_STEP_OPTIONS = STEP_OPTIONS.without("devices", "workers", owner="build_sync_train_graph")
# Through the ps tasks, the options this path decides itself (the towers, the update, the
# step, the moving average and clipping, on the chief or refused) and those it passes on.
_PASSED_THROUGH = SYNC_STEP_OPTIONS.without(
    "num_towers", "device_type", "update", "global_step", "ema_decay", "clipping")


def build_sync_train_graph(tower_fn, inputs, optimizer, cluster, *, device_function=None,
                           **options):
    """Builds this replica's synchronous training step.

    Its options are build_train_graph's, by the same names and defaults
    (SYNC_STEP_OPTIONS: all but `devices` and `workers`, which the cluster
    decides), plus the cluster and `device_function`.

    `update` chooses how the workers combine, as on one machine: None or
    towerlib.ParameterServer() trains through the ps tasks (below);
    towerlib.Replicated() all-reduces across the workers, in a cluster
    without ps tasks (towerlib.cluster.allreduce_job, which takes every option
    of build_train_graph, bn_mode='sync' included).

    Call it in every replica with the same model, optimizer and arguments;
    `inputs` is this replica's own part of the global batch (say, rows
    [r * B / R, (r + 1) * B / R) for replica r = cluster.replica_index).
    Build the inputs (and the global step, if they read it) under
    `tf.compat.v1.device(placer)` with `placer = ParameterServerPlacer(cluster)`
    passed here as `device_function`, so that input ops run on this replica
    and any variable lands on a ps task.

    Args:
      tower_fn, inputs, precision, exchange, accumulation_steps, global_step,
      learning_rate, var_list, summaries, check_isolation: as for
        towerlib.build_train_graph.
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
      clipping: towerlib.ClipByGlobalNorm(...) with update=Replicated() (the
        norm of the gradient all-reduced over every worker); refused through
        ps tasks, where each worker applies its own gradient before they meet.

    Returns:
      A SyncTrainGraph.
    """
    check_cluster(cluster, "build_sync_train_graph")
    options = SYNC_STEP_OPTIONS.with_defaults(options)
    if cluster.is_ps:
        raise ValueError(
            "build_sync_train_graph runs on a training task (worker or chief); a ps "
            "task only serves variables (run_parameter_server).")
    update = resolve_update("parameter_server" if options["update"] is None
                            else options["update"])
    if update.exchanges_gradients and device_function is not None:
        raise ValueError(
            "device_function places variables on ps tasks, and update="
            f"{update!r} keeps a copy of each on every worker. Fix: drop device_function "
            "(build the inputs under tf.device(cluster.task_device)).")
    if update.exchanges_gradients:
        return allreduce_job.build_allreduce_train_graph(
            tower_fn, inputs, optimizer, cluster, **dict(options, update=update))
    return _build_through_ps_tasks(tower_fn, inputs, optimizer, cluster, device_function,
                                   options)


def _build_through_ps_tasks(tower_fn, inputs, optimizer, cluster, device_function, options):
    """The parameter-server path: SyncReplicasOptimizer over the ps tasks' variables."""
    if options["clipping"] is not None:
        raise ValueError(
            "clipping is taken over the whole global batch's gradient, which the "
            "parameter-server path never holds in one place (each worker hands its own "
            "to SyncReplicasOptimizer). Fix: update=towerlib.Replicated() (all-reduce "
            "across the workers), or no clipping.")
    if global_batches.inputs_of(tf.compat.v1.get_default_graph()):
        raise ValueError(
            "towerlib.global_batch_input keeps its position in variables each worker "
            "must own, and through ps tasks every worker would share them (each step "
            "would count W batches). Fix: update=towerlib.Replicated() (all-reduce "
            "across the workers, no ps task), or an input of each worker's own.")
    if cluster.num_ps == 0:
        raise ValueError(
            "This cluster has no ps task, so the parameter-server path has nowhere to "
            "keep the variables. Fix: give the ps addresses (--ps_hosts), or "
            "all-reduce across the workers with update=towerlib.Replicated().")
    check_bn_mode_for_cluster(options["bn_mode"], cluster)
    if isinstance(optimizer, tf.compat.v1.train.SyncReplicasOptimizer):
        raise TypeError("Pass the plain optimizer; build_sync_train_graph wraps it "
                        "in SyncReplicasTowerOptimizer itself.")
    placer = device_function or placement.ParameterServerPlacer(cluster)
    devices = placement.tower_devices(cluster, options["num_towers"], options["device_type"])
    with tf.compat.v1.device(placer):
        global_step = options["global_step"]
        if global_step is None:
            global_step = tf.compat.v1.train.get_or_create_global_step()
        check_ema_decay(options["ema_decay"])
        ema = None
        if options["ema_decay"] is not None:
            ema = tf.compat.v1.train.ExponentialMovingAverage(
                options["ema_decay"], num_updates=global_step)
        sync_optimizer = SyncReplicasTowerOptimizer(
            optimizer, cluster.num_replicas, cluster.is_chief, variable_averages=ema)
        # The chief applies the moving average itself (variable_averages): the
        # step builds none, and reports the optimizer's. Each variable is read
        # from its ps once per step and worker, on the worker's CPU, and handed
        # to every tower from there (not once per tower over the network).
        reads_cached = tf.compat.v1.variable_scope(
            tf.compat.v1.get_variable_scope(),
            caching_device=f"{cluster.task_device}/device:CPU:0")
        with reads_cached:
            train_graph = build_train_graph(
                tower_fn, inputs, sync_optimizer, **dict(
                    _PASSED_THROUGH.pick(options),
                    devices=devices, update=ParameterServer(device=placer),
                    global_step=global_step))
    return SyncTrainGraph(
        train_graph=train_graph, optimizer=sync_optimizer,
        hooks=(sync_optimizer.make_session_run_hook(),), cluster=cluster,
        session_config=placement.session_config(cluster, len(devices)),
        device_function=placer)

"""What a training run will do, decided before its graph is built, and how it ended.

`make_plan` makes the data available and validates it (data_source.prepare), places the
towers and derives the learning-rate schedule and the last step from the number of
training examples: a `TrainPlan`, all that building and running the step needs besides
the flags. `describe` states it in the run's first log line; `restore_point` says where
the run resumes; `check_cluster_flags` refuses what cannot work on a cluster.
"""

import dataclasses
import logging
import time
from typing import Any, List, Optional

import tensorflow as tf

import towerlib
from examples.cifar10 import data, data_source, input_pipeline, options, run_folder, schedule

logger = logging.getLogger("cifar10")


@dataclasses.dataclass
class TrainPlan:
    """Everything decided before the graph is built."""

    flags: Any  # the run's flags: given, else recorded, else defaults (run_folder)
    model: Any  # the tower function, a train.CifarModel (models.make_model)
    update: Any  # the strategies: towerlib.ParameterServer or Replicated,
    precision: Any  # towerlib.Float32, BFloat16 or Float16,
    exchange: Any  # towerlib.GraphExchange, CollectiveExchange, or None: by device
    devices: List[str]
    data_dir: str
    train_files: data.SplitFiles
    test_files: data.SplitFiles
    max_steps: int
    lr_schedule: schedule.LearningRateSchedule
    augmentation: str
    # Examples this process reads per step: the global batch on one machine, this
    # worker's share of it (global batch / workers) on a cluster.
    batch_size: int
    cluster: Optional[towerlib.cluster.ClusterInfo] = None  # None: one machine

    @property
    def is_chief(self) -> bool:
        """Whether this process writes train_dir (always, on one machine)."""
        return self.cluster is None or self.cluster.is_chief

    @property
    def allreduce(self) -> bool:
        """Whether the workers of a cluster all-reduce (no ps task)."""
        return self.cluster is not None and self.flags.variable_update == "replicated"

    @property
    def global_input(self) -> bool:
        """Whether the input is the global batch fixed by the step (one machine, or the
        all-reduce workers): its variables are this process's, in its checkpoints. Through
        ps tasks they would be shared by every worker: each worker reads its shard."""
        return self.cluster is None or self.allreduce

    @property
    def workers(self):
        """This process among the workers that read the global batch (None: alone)."""
        return None if self.cluster is None else self.cluster.worker_group

    @property
    def num_shards(self) -> int:
        return 1 if self.cluster is None else self.cluster.num_replicas

    @property
    def shard_index(self) -> int:
        return 0 if self.cluster is None else self.cluster.replica_index

    @property
    def loop_options(self) -> dict:
        """run_training's (and run_distributed_training's) options: the folder, the last
        step, how often the loop logs, saves and writes summaries, the steps it traces."""
        flags = self.flags
        return dict(train_dir=flags.train_dir, max_steps=self.max_steps,
                    log_every_n_steps=flags.log_every_n_steps, trace_steps=flags.trace_steps,
                    save_checkpoint_steps=flags.save_checkpoint_steps,
                    save_summaries_steps=flags.save_summaries_steps,
                    examples_per_step=flags.global_batch_size)  # the whole cluster's batch


@dataclasses.dataclass
class TrainResult:
    global_step: int  # where training stopped
    start_step: int  # where it started (> 0 when resumed from a checkpoint)
    loss: Optional[float]  # the last step's loss (None when no step ran)
    seconds: float  # wall time of the training loop
    plan: TrainPlan
    stop_signal: Optional[str] = None  # 'SIGTERM' when a signal stopped training


def check_cluster_flags(flags, cluster):
    """Refuses what cannot work on this cluster. Returns (each worker's share of the global
    batch: equal shares keep one synchronous step the mean over the global batch; the kind
    of optimizer the step will use, for towerlib.validate_config to judge the precision).

    Raises:
      FlagError: naming the flag and the fix.
    """
    allreduce = flags.variable_update == "replicated"
    if allreduce and cluster.num_ps:
        raise options.FlagError(
            "--variable_update=replicated all-reduces across the workers, and the cluster "
            "has %d ps task(s). Fix: drop --ps_hosts (no ps task), or drop "
            "--variable_update to train through the ps tasks." % cluster.num_ps)
    if not allreduce and not cluster.num_ps:
        raise options.FlagError(
            "--variable_update=%s: the cluster has no ps task to hold the variables. Fix: "
            "give --ps_hosts, or --variable_update=replicated to all-reduce across the "
            "workers." % flags.variable_update)
    if flags.param_device not in ("", "cpu"):
        raise options.FlagError(
            "--param_device=%s: in a cluster the variables live on the ps tasks (placed "
            "by byte size), not on a worker's devices. Leave --param_device at its "
            "default (cpu); it only matters on one machine." % flags.param_device)
    if not allreduce:  # the all-reduce exchange spans the workers: sync works there
        with options.blamed_on(flags, "bn_mode"):
            towerlib.cluster.check_bn_mode_for_cluster(flags.bn_mode, cluster)
    workers = cluster.num_replicas
    per_worker, rest = divmod(flags.global_batch_size, workers)
    if rest:
        lower = flags.global_batch_size - rest
        raise options.FlagError(
            "--global_batch_size=%d does not divide over the %d workers of this cluster: "
            "each worker trains on global_batch_size / workers examples per step (equal "
            "shares keep one step the mean over the global batch). Use a multiple of %d, "
            "e.g. %s%d." % (flags.global_batch_size, workers, workers,
                            "%d or " % lower if lower else "", lower + workers))
    plain = tf.compat.v1.train.GradientDescentOptimizer(0.1)
    return per_worker, (plain if allreduce else
                        tf.compat.v1.train.SyncReplicasOptimizer(plain, workers))


def serve_parameters(cluster, variable_update: str, timeout_secs: Optional[float] = None):
    """Runs a ps task: serves its share of the variables until every worker is done."""
    if variable_update != "parameter_server":  # the workers refuse it: do not wait for them
        raise options.FlagError(
            "--variable_update=%s all-reduces across the workers and needs no ps task. "
            "Fix: do not start a ps (drop --ps_hosts everywhere), or drop "
            "--variable_update to train through the ps tasks." % variable_update)
    logger.info("ps task %d of %d at %s: serving variables until the %d workers are done%s.",
                cluster.task_index, cluster.num_ps,
                cluster.jobs[cluster.job_name][cluster.task_index], cluster.num_replicas,
                " (at most %g s)" % timeout_secs if timeout_secs else "")
    towerlib.cluster.run_parameter_server(cluster, timeout_secs=timeout_secs or None)
    logger.info("ps task %d: every worker is done, exiting.", cluster.task_index)


def make_plan(flags, model, strategies, cluster=None, batch_size=None) -> TrainPlan:
    """Places the towers, prepares and validates the data, derives the schedule.

    Raises:
      DataError, DownloadError: a problem with the data, with the fix.
    """
    num_towers, device_type = flags.num_towers or None, flags.device_type or None
    if cluster is None:
        devices = towerlib.tower_devices(num_towers, device_type)
    else:
        devices = towerlib.cluster.tower_devices(cluster, num_towers, device_type)
    data_dir, train_files, test_files = data_source.prepare(
        flags.data_dir or None, flags.train_dir, flags.download, flags.download_url,
        log=logger.info)
    # The schedule counts global steps, one per GLOBAL batch, whatever the cluster.
    examples = train_files.num_examples
    lr_schedule = schedule.make_schedule(
        flags.learning_rate, flags.global_batch_size, examples,
        decay_epochs=flags.lr_decay_epochs, decay_factor=flags.lr_decay_factor,
        warmup_epochs=flags.warmup_epochs, scale_with_batch=flags.scale_lr_with_batch)
    max_steps = flags.max_steps
    if flags.train_epochs > 0:
        max_steps = max(1, schedule.epochs_to_steps(
            flags.train_epochs, examples, flags.global_batch_size))
    return TrainPlan(
        flags, model, *strategies, devices=devices, data_dir=data_dir,
        train_files=train_files, test_files=test_files,
        max_steps=max_steps, lr_schedule=lr_schedule,
        augmentation=flags.augmentation or model.default_augmentation,
        batch_size=batch_size or flags.global_batch_size, cluster=cluster)


def restore_point(plan: TrainPlan):
    """(the checkpoint a (re)start restores or None, its global step); logs a resume.

    Raises:
      FlagError: on a cluster, a run already at its last step (the ps and the other
        workers would wait for a chief that trains nothing).
    """
    flags = plan.flags
    # Only the chief restores (across all-reducing workers, each its own folder's
    # checkpoint of the step they agree on: towerlib.cluster.allreduce_job).
    checkpoint = run_folder.restorable_checkpoint(flags.train_dir) if plan.is_chief else None
    step = int(tf.train.load_variable(checkpoint, "global_step")) if checkpoint else 0
    if step:
        logger.info("Resuming from the checkpoint in %s at global step %d.",
                    flags.train_dir, step)
    if step >= plan.max_steps and plan.cluster is not None:
        raise options.FlagError(
            "The checkpoint in --train_dir=%r is at global step %d, and --max_steps (or "
            "--train_epochs) asks to stop at %d: nothing to train. On a cluster the chief "
            "cannot just skip training, the ps and the other workers would wait for it. "
            "Fix: raise --max_steps to continue the run, or use a new --train_dir; stop the "
            "other tasks." % (flags.train_dir, step, plan.max_steps))
    if step >= plan.max_steps:
        logger.info("Global step %d has reached the last step %d: nothing to train.",
                    step, plan.max_steps)
    return checkpoint, step


def finished(plan, start_step, result, started) -> TrainResult:
    """The TrainResult of a training loop that began at `started` (time.time())."""
    flags = plan.flags
    seconds = time.time() - started
    step = result.global_step if result.global_step is not None else start_step
    logger.info(
        "Trained from global step %d to %d in %.1f s (%.1f examples/sec overall, graph "
        "start-up included); %s.", start_step, step, seconds,
        (step - start_step) * flags.global_batch_size / max(seconds, 1e-9),
        "checkpoints in %s" % flags.train_dir if plan.is_chief
        else "the chief writes the checkpoints")
    loss = None if result.loss is None else float(result.loss)
    return TrainResult(step, start_step, loss, seconds, plan,
                       getattr(result, "stop_signal", None))


def _variables(flags, update) -> str:
    """Where the variables live and how gradients reach them, for the first log line."""
    if flags.variable_update == "replicated":
        return "every tower (replicated, gradients all-reduced, %s)" % (
            "packed into buffers of %d bytes" % update.pack_bytes if update.pack_bytes
            else "not packed")
    return flags.param_device or "cpu"


def _arithmetic(flags, precision) -> str:
    """The compute dtype and the micro-batches, for the first log line ('' by default)."""
    parts = []
    if flags.compute_dtype != "float32":
        scale = getattr(precision, "loss_scale", None)
        parts.append("computing in %s on float32 weights%s" % (
            flags.compute_dtype, ", loss scale %s" % scale if scale else ""))
    if flags.accumulation_steps > 1:
        parts.append("%d micro-batches per step" % flags.accumulation_steps)
    return "".join(", " + part for part in parts)


def _rate(flags, lr_schedule) -> str:
    """The learning rate and its schedule, for the first log line."""
    text = "learning rate %g (%s)" % (lr_schedule.base_rate, flags.optimizer)
    if lr_schedule.boundaries:
        text += " with decays x%g after steps %s" % (lr_schedule.decay_factor,
                                                  lr_schedule.boundaries)
    else:
        text += ", constant (no --lr_decay_epochs)"
    if lr_schedule.warmup_steps:
        text += ", warm-up %d steps" % lr_schedule.warmup_steps
    return text


def describe(plan: TrainPlan) -> str:
    """The plan as the run's first log line: where, on what, which schedule, until when."""
    flags = plan.flags
    per_tower, extra = divmod(plan.batch_size, len(plan.devices))
    shares = ("%d per tower" % per_tower if not extra
              else "%d or %d per tower" % (per_tower + 1, per_tower))
    steps_per_epoch = schedule.steps_per_epoch(
        plan.train_files.num_examples, flags.global_batch_size)
    if plan.cluster is None:
        where = "on %d tower(s) %s, global batch %d (%s)" % (
            len(plan.devices), plan.devices, flags.global_batch_size, shares)
        variables = _variables(flags, plan.update)
    else:
        cluster = plan.cluster
        read = ("its slice of each global batch" if plan.global_input else
                "from shard %d of %d of the training data (%d examples)" % (
                    plan.shard_index + 1, plan.num_shards,
                    input_pipeline.shard_size(plan.train_files.num_examples,
                                              plan.num_shards, plan.shard_index)))
        where = (
            "as worker %d of %d%s (%s) on %d tower(s) %s, %d examples per step of the "
            "global batch %d (%s), %s"
            % (cluster.replica_index, cluster.num_replicas,
               ", the chief" if cluster.is_chief else "", cluster.task_device,
               len(plan.devices), plan.devices, plan.batch_size, flags.global_batch_size,
               shares, read))
        variables = ("every tower of every worker (replicated, gradients all-reduced "
                     "across the %d workers)" % cluster.num_replicas if plan.allreduce
                     else "the %d ps task(s)" % cluster.num_ps)
    return (
        "Training %s %s, bn_mode=%s, variables on %s%s; %d training examples = %.1f steps "
        "per epoch; %s; until global step %d (%.1f epochs)."
        % (flags.model, where, flags.bn_mode, variables, _arithmetic(flags, plan.precision),
           plan.train_files.num_examples, steps_per_epoch, _rate(flags, plan.lr_schedule),
           plan.max_steps, plan.max_steps / steps_per_epoch))

"""What a training run will do, decided before its graph is built.

`make_plan` checks the settings (config.check, and config.check_cluster on a cluster),
makes the data available and validates it (data_source.prepare), and derives the
learning-rate schedule and the last step from the number of training examples. The
result, a `TrainPlan`, is all that building and running the training graph needs
(train.py); `describe` states it in the run's first log line.
"""

import dataclasses
import logging
from typing import List, Optional

from examples.cifar10 import config as config_lib
from examples.cifar10 import data, data_source, input_pipeline, run_folder, schedule
from towerlib import cluster as cluster_lib

logger = logging.getLogger("cifar10")


@dataclasses.dataclass
class TrainPlan:
    """Everything decided before the graph is built."""

    config: config_lib.TrainConfig
    devices: List[str]
    data_dir: str
    train_files: data.SplitFiles
    test_files: data.SplitFiles
    max_steps: int
    lr_schedule: schedule.LearningRateSchedule
    # In a cluster: this worker's task; None on one machine.
    cluster: Optional[cluster_lib.ClusterInfo] = None
    # Examples this process reads per step: the global batch on one machine, this
    # worker's share of it (global batch / workers) in a cluster. 0: the global batch.
    batch_size: int = 0

    def __post_init__(self):
        self.batch_size = self.batch_size or self.config.global_batch_size

    @property
    def is_chief(self) -> bool:
        """Whether this process writes train_dir (always, on one machine)."""
        return self.cluster is None or self.cluster.is_chief

    @property
    def num_shards(self) -> int:
        return 1 if self.cluster is None else self.cluster.num_replicas

    @property
    def shard_index(self) -> int:
        return 0 if self.cluster is None else self.cluster.replica_index


def make_plan(
    config: config_lib.TrainConfig,
    cluster: Optional[cluster_lib.ClusterInfo] = None,
    overwrite_train_dir: bool = False,
) -> TrainPlan:
    """Checks the flags, prepares and validates the data, and derives the schedule.

    Nothing is written before every check of the flags passed, the folder's included
    (run_folder: writable, and holding this run or none unless overwrite_train_dir).

    Args:
      config: the run's settings.
      cluster: this worker's task in a cluster (not a ps task); None on one machine.
      overwrite_train_dir: the run in train_dir is to be replaced (not compared).

    Raises:
      ConfigError, DataError, DownloadError: a problem the user can fix, with the fix.
    """
    devices = config_lib.check(config)
    batch_size = config.global_batch_size
    if cluster is not None:
        if cluster.is_ps:
            raise ValueError("A ps task does not train; run serve_parameters(cluster).")
        batch_size = config_lib.check_cluster(config, cluster, len(devices))
        devices = cluster_lib.tower_devices(
            cluster, config.num_towers or None, config.device_type
        )
    is_chief = cluster is None or cluster.is_chief
    if is_chief:
        run_folder.check_writable(config.train_dir)
    if not overwrite_train_dir:
        run_folder.check_flags_match_folder(config)
    data_dir, train_files, test_files = data_source.prepare(
        config.data_dir,
        config.train_dir,
        config.download,
        config.download_url,
        log=logger.info,
    )
    # The schedule counts global steps, one per GLOBAL batch, whatever the cluster.
    examples = train_files.num_examples
    lr_schedule = schedule.make_schedule(  # its settings were checked by config_lib.check
        config.learning_rate,
        config.global_batch_size,
        examples,
        decay_epochs=config.lr_decay_epochs,
        decay_factor=config.lr_decay_factor,
        warmup_epochs=config.warmup_epochs,
        scale_with_batch=config.scale_lr_with_batch,
    )
    max_steps = config.max_steps
    if config.train_epochs > 0:
        max_steps = max(
            1,
            schedule.epochs_to_steps(
                config.train_epochs, examples, config.global_batch_size
            ),
        )
    return TrainPlan(
        config=config,
        devices=devices,
        data_dir=data_dir,
        train_files=train_files,
        test_files=test_files,
        max_steps=max_steps,
        lr_schedule=lr_schedule,
        cluster=cluster,
        batch_size=batch_size,
    )


def _variables_on_one_machine(config: config_lib.TrainConfig) -> str:
    """Where the variables live and how gradients reach them, for the first log line."""
    if config.variable_update == "replicated":
        packing = (
            "packed into buffers of %d bytes" % config.gradient_pack_bytes
            if config.gradient_pack_bytes
            else "not packed"
        )
        return "every tower (replicated, gradients all-reduced, %s)" % packing
    return config.param_device or "cpu"


def _arithmetic(config: config_lib.TrainConfig) -> str:
    """The compute dtype and the micro-batches, for the first log line ('' by default)."""
    parts = []
    if config.compute_dtype != "float32":
        scale = config.resolved_loss_scale()
        parts.append(
            "computing in %s on float32 weights%s"
            % (
                config.compute_dtype,
                ", loss scale %s" % (scale or "dynamic")
                if config.compute_dtype == "float16"
                else "",
            )
        )
    if config.accumulation_steps > 1:
        parts.append("%d micro-batches per step" % config.accumulation_steps)
    return "".join(", " + part for part in parts)


def describe(plan: TrainPlan) -> str:
    """The plan as the run's first log line: where, on what, which schedule, until when."""
    config = plan.config
    per_tower, extra = divmod(plan.batch_size, len(plan.devices))
    shares = (
        "%d per tower" % per_tower
        if not extra
        else "%d or %d per tower" % (per_tower + 1, per_tower)
    )
    steps_per_epoch = schedule.steps_per_epoch(
        plan.train_files.num_examples, config.global_batch_size
    )
    if plan.cluster is None:
        where = "on %d tower(s) %s, global batch %d (%s)" % (
            len(plan.devices),
            plan.devices,
            config.global_batch_size,
            shares,
        )
        variables = _variables_on_one_machine(config)
    else:
        cluster = plan.cluster
        where = (
            "as worker %d of %d%s (%s) on %d tower(s) %s, %d examples per step of the "
            "global batch %d (%s), from shard %d of %d of the training data (%d examples)"
            % (
                cluster.replica_index,
                cluster.num_replicas,
                ", the chief" if cluster.is_chief else "",
                cluster.task_device,
                len(plan.devices),
                plan.devices,
                plan.batch_size,
                config.global_batch_size,
                shares,
                plan.shard_index + 1,
                plan.num_shards,
                input_pipeline.shard_size(
                    plan.train_files.num_examples, plan.num_shards, plan.shard_index
                ),
            )
        )
        variables = "the %d ps task(s)" % cluster.num_ps
    return (
        "Training %s %s, bn_mode=%s, variables on %s%s; %d training examples = %.1f "
        "steps per epoch; learning rate %g (%s) with decays x%g at steps %s%s; until "
        "global step %d (%.1f epochs)."
        % (
            config.model,
            where,
            config.bn_mode,
            variables,
            _arithmetic(config),
            plan.train_files.num_examples,
            steps_per_epoch,
            plan.lr_schedule.base_rate,
            config.optimizer,
            config.lr_decay_factor,
            plan.lr_schedule.boundaries or "none",
            ", warm-up %d steps" % plan.lr_schedule.warmup_steps
            if plan.lr_schedule.warmup_steps
            else "",
            plan.max_steps,
            plan.max_steps / steps_per_epoch,
        )
    )

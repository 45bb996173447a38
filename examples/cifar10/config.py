"""The training run's settings, checked before anything is built, and kept with the run.

`TrainConfig` is what the train script's flags amount to. `check()` turns every setting
that cannot work into one clear error before any data is touched or any graph is built.
The settings that towerlib itself takes (the global batch over the towers, the batch-norm
mode, where variables live, the weight EMA) are judged by ``towerlib.validate_config``;
the error is worded here, naming the flag and its fix.

The config is saved as ``train_dir/train_config.json``, so the eval and export scripts
rebuild the very model that was trained (name, EMA, data folder) from ``--train_dir``
alone, and a restart with an incompatible model in the same folder is refused.
"""

import dataclasses
import json
import math
import os
from typing import List, Optional, Set, Union

import towerlib
from examples.cifar10 import default_dirs, input_pipeline, models, schedule
from towerlib.step import accumulation as accumulation_lib
from towerlib import cluster as cluster_lib
from towerlib.run import durable_files
from towerlib.precision import casting as mixed_precision
import towerlib.update as variable_update_lib

CONFIG_FILE = "train_config.json"
OPTIMIZERS = ("sgd", "momentum")
DEVICE_TYPES = ("gpu", "cpu")


class ConfigError(ValueError):
    """A setting (flag) that cannot work; the message names it and the fix."""


@dataclasses.dataclass
class TrainConfig:
    """Settings of one training run (see train.py's flags for their meaning)."""

    # Per user and clone of the repository (default_dirs), never one shared /tmp folder.
    train_dir: str = dataclasses.field(
        default_factory=lambda: default_dirs.default_train_dir("train")
    )
    data_dir: Optional[str] = None  # None: generated data under train_dir
    download: bool = False
    download_url: str = ""
    model: str = "convnet"
    augmentation: Optional[str] = None  # None: the model's own
    num_towers: int = 0  # 0: one per GPU, else one CPU device
    device_type: Optional[str] = None  # None: GPUs when present, else CPUs
    global_batch_size: int = 128
    bn_mode: str = "first_tower"
    sync_transport: Optional[str] = None  # None: NCCL collectives on GPUs, else graph
    bn_momentum: float = 0.99
    # None: the host CPU with parameter_server (each tower's own device with replicated).
    param_device: Optional[str] = None
    variable_update: str = "parameter_server"
    gradient_pack_bytes: int = variable_update_lib.DEFAULT_PACK_BYTES
    compute_dtype: str = "float32"  # the towers' arithmetic; the weights stay float32
    loss_scale: Optional[str] = None  # float16 only: None (dynamic), 'dynamic' or a number
    accumulation_steps: int = 1  # micro-batches per optimizer step
    optimizer: str = "momentum"
    momentum: float = 0.9
    learning_rate: float = 0.05
    scale_lr_with_batch: bool = False
    lr_decay_epochs: List[float] = dataclasses.field(default_factory=list)
    lr_decay_factor: float = 0.1
    warmup_epochs: float = 0.0
    weight_decay: Optional[float] = None  # None: the model's own
    ema_decay: Optional[float] = None
    max_steps: int = 1000
    train_epochs: float = 0.0  # > 0: overrides max_steps
    log_every_n_steps: int = 50
    save_checkpoint_steps: int = 500
    save_summaries_steps: int = 50
    seed: Optional[int] = None

    def resolved_augmentation(self) -> str:
        return self.augmentation or models.make_model(self.model).default_augmentation

    def make_model(self) -> models.CifarModel:
        return models.make_model(self.model, self.weight_decay, self.bn_momentum)

    def tower_devices(self) -> List[str]:
        return towerlib.tower_devices(self.num_towers or None, self.device_type)

    def resolved_loss_scale(self) -> Union[None, str, float]:
        """build_train_graph's loss_scale: None (its default), 'dynamic' or a number."""
        if self.loss_scale is None or str(self.loss_scale) == "dynamic":
            return self.loss_scale
        return float(self.loss_scale)


def _refused_by_towerlib(config: TrainConfig, devices: List[str]) -> Set[str]:
    """The settings, by towerlib's option names, that towerlib.validate_config refuses."""
    try:
        towerlib.validate_config(
            devices=devices,
            global_batch_size=config.global_batch_size,
            bn_mode=config.bn_mode,
            param_device=config.param_device,
            ema_decay=config.ema_decay,
        )
    except towerlib.ConfigError as e:
        return {problem.option for problem in e.problems}
    return set()


def _refused_by_variable_update_check(variable_update, param_device, pack_bytes) -> bool:
    """Whether towerlib.update.variable_update.check_variable_update refuses these settings."""
    try:
        choice = variable_update_lib.resolve_update(variable_update)
        variable_update_lib.Replicated(pack_bytes=pack_bytes)
        if choice.name == "replicated":
            return param_device is not None
        variable_update_lib.ParameterServer(device=param_device or "cpu")
    except ValueError:
        return True
    return False


def _check_variable_update(config: TrainConfig) -> None:
    """--variable_update, --gradient_pack_bytes and --param_device, judged by towerlib.

    towerlib's check says no in one message for any of three reasons; asking it about
    one setting at a time tells which flag to name.
    """
    default_bytes = variable_update_lib.DEFAULT_PACK_BYTES
    if _refused_by_variable_update_check(config.variable_update, None, default_bytes):
        raise ConfigError(
            "--variable_update=%r: choose %s."
            % (config.variable_update, " or ".join(variable_update_lib.UPDATE_NAMES))
        )
    if _refused_by_variable_update_check(
        config.variable_update, None, config.gradient_pack_bytes
    ):
        raise ConfigError(
            "--gradient_pack_bytes=%r: use a size in bytes >= 0 (0: no packing; "
            "default %d)." % (config.gradient_pack_bytes, default_bytes)
        )
    if _refused_by_variable_update_check(
        config.variable_update, config.param_device, config.gradient_pack_bytes
    ):
        raise ConfigError(
            "--variable_update=%s with --param_device=%s: replicated puts each tower's "
            "copy of the variables on the tower's own device, so there is no parameter "
            "device to choose. Fix: drop --param_device, or use "
            "--variable_update=parameter_server."
            % (config.variable_update, config.param_device)
        )


def _check_loss_scale(config: TrainConfig) -> None:
    """--loss_scale: 'dynamic' or a positive number, and only with float16 (the one dtype
    whose small gradients underflow)."""
    if config.loss_scale is None:
        return
    if str(config.loss_scale) != "dynamic":
        try:
            value = float(config.loss_scale)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value > 0):
            raise ConfigError(
                "--loss_scale=%r: use dynamic (the default with --compute_dtype=float16) "
                "or a positive number, a fixed scale (e.g. 1024); or leave it empty."
                % config.loss_scale
            )
    if config.compute_dtype != "float16":
        raise ConfigError(
            "--loss_scale=%s with --compute_dtype=%s: only float16 needs loss scaling (its "
            "small gradients underflow; bfloat16 has float32's range). Fix: drop "
            "--loss_scale, or use --compute_dtype=float16."
            % (config.loss_scale, config.compute_dtype)
        )


def _check_precision_and_accumulation(config: TrainConfig, num_towers: int) -> None:
    """--compute_dtype, --loss_scale and --accumulation_steps, judged by towerlib's own
    checks where it has them; the batch arithmetic is worded here with the numbers."""
    # towerlib's names only: its check also takes TensorFlow's aliases ('half'), which
    # the log line and train_config.json would then show instead of the dtype.
    if config.compute_dtype not in mixed_precision.COMPUTE_DTYPES:
        raise ConfigError(
            "--compute_dtype=%r: choose %s (the weights stay float32 either way)."
            % (config.compute_dtype, ", ".join(mixed_precision.COMPUTE_DTYPES))
        )
    _check_loss_scale(config)
    try:
        accumulation_lib.check_accumulation_steps(config.accumulation_steps)
    except ValueError as e:
        raise ConfigError(
            "--accumulation_steps=%r: use a whole number >= 1 (1: no accumulation)."
            % config.accumulation_steps
        ) from e
    _check_micro_batches(config.global_batch_size, config.accumulation_steps, num_towers)


def _check_micro_batches(batch_size: int, accumulation_steps: int, num_towers: int) -> None:
    """Every tower needs an example in every micro-batch: batch >= k x towers."""
    needed = accumulation_steps * num_towers
    if batch_size < needed:
        raise ConfigError(
            "--global_batch_size=%d with --accumulation_steps=%d on %d towers: each step "
            "splits the global batch into %d micro-batches, each over the %d towers, so it "
            "needs at least %d x %d = %d examples. Use --global_batch_size >= %d, or fewer "
            "--accumulation_steps or --num_towers."
            % (batch_size, accumulation_steps, num_towers, accumulation_steps, num_towers,
               accumulation_steps, num_towers, needed, needed)
        )


def check(config: TrainConfig) -> List[str]:
    """Checks every setting that needs no data; returns the tower devices.

    Raises:
      ConfigError: naming the flag, its value, and what would work.
    """
    try:
        config.make_model()
    except ValueError as e:
        raise ConfigError("--model: %s" % e) from e
    if config.augmentation is not None:
        try:
            input_pipeline.check_augmentation(config.augmentation)
        except ValueError as e:
            raise ConfigError("--augmentation: %s" % e) from e
    if config.device_type not in (None,) + DEVICE_TYPES:
        raise ConfigError(
            "--device_type=%r: use gpu, cpu, or leave it empty (GPUs when the "
            "machine has them)." % config.device_type
        )
    if config.num_towers < 0:
        raise ConfigError(
            "--num_towers=%d: use a positive count, or 0 for one tower per GPU."
            % config.num_towers
        )
    try:
        devices = config.tower_devices()
    except ValueError as e:
        raise ConfigError("--num_towers=%d: %s" % (config.num_towers, e)) from e
    refused = _refused_by_towerlib(config, devices)
    if "global_batch_size" in refused:
        raise ConfigError(
            "--global_batch_size=%d cannot be split over %d towers: every tower needs at "
            "least one example per step. Use --global_batch_size >= %d (a multiple of %d "
            "splits evenly), or fewer --num_towers."
            % (config.global_batch_size, len(devices), len(devices), len(devices))
        )
    if "bn_mode" in refused:
        raise ConfigError(
            "--bn_mode=%r: choose one of %s."
            % (config.bn_mode, ", ".join(towerlib.BN_MODES))
        )
    if config.sync_transport not in (None,) + towerlib.exchange.TRANSPORTS:
        raise ConfigError(
            "--sync_transport=%r: choose %s, or leave it empty for the default "
            "(collective on GPUs, graph otherwise)."
            % (config.sync_transport, " or ".join(towerlib.exchange.TRANSPORTS))
        )
    if "param_device" in refused:
        raise ConfigError(
            "--param_device=%r: choose cpu (variables on the host) or gpu "
            "(spread over the tower GPUs)." % config.param_device
        )
    _check_variable_update(config)
    _check_precision_and_accumulation(config, len(devices))
    if config.optimizer not in OPTIMIZERS:
        raise ConfigError(
            "--optimizer=%r: choose one of %s." % (config.optimizer, ", ".join(OPTIMIZERS))
        )
    if "ema_decay" in refused:
        raise ConfigError(
            "--ema_decay=%r: use a value in (0, 1), e.g. 0.999, or leave it "
            "unset for no moving average." % config.ema_decay
        )
    try:
        schedule.check_settings(
            config.learning_rate,
            config.lr_decay_epochs,
            config.lr_decay_factor,
            config.warmup_epochs,
        )
    except ValueError as e:
        raise ConfigError(
            "Learning-rate flags (--learning_rate, --lr_decay_epochs, "
            "--lr_decay_factor, --warmup_epochs): %s" % e
        ) from e
    if not 0 < config.bn_momentum < 1:
        raise ConfigError("--bn_momentum=%r: use a value in (0, 1)." % config.bn_momentum)
    if config.max_steps < 1 and config.train_epochs <= 0:
        raise ConfigError(
            "--max_steps=%d: train for at least one step (or set --train_epochs)."
            % config.max_steps
        )
    if config.download and not config.data_dir:
        raise ConfigError(
            "--download needs --data_dir: the folder to put cifar-10-batches-bin/ "
            "in (e.g. --data_dir=/tmp/cifar10_data)."
        )
    if not config.train_dir:
        raise ConfigError(
            "--train_dir is empty: give a folder for checkpoints and summaries."
        )
    for name in ("save_checkpoint_steps", "save_summaries_steps", "log_every_n_steps"):
        if getattr(config, name) < 1:
            raise ConfigError(
                "--%s=%d: use a count of steps >= 1." % (name, getattr(config, name))
            )
    return devices


def check_variable_update_for_cluster(config: TrainConfig) -> None:
    """Refuses replicated variables on a cluster, on every task (a ps task too, which would
    otherwise wait for workers that refuse to start)."""
    if config.variable_update != "parameter_server":
        raise ConfigError(
            "--variable_update=%s: replicated is for the towers of one machine; in a "
            "cluster the variables live on the ps tasks. Fix: drop --variable_update "
            "(parameter_server) on a cluster." % config.variable_update
        )


def check_cluster(
    config: TrainConfig, cluster: cluster_lib.ClusterInfo, towers_per_worker: int
) -> int:
    """Checks the settings that depend on the cluster; returns each worker's batch.

    Every worker trains on global_batch_size / workers examples per step, so that one
    synchronous step is the mean over the whole global batch, as on one machine.

    Raises:
      ConfigError: naming the flag, its value, and what would work.
    """
    workers = cluster.num_replicas
    check_variable_update_for_cluster(config)
    if config.param_device not in (None, "cpu"):
        raise ConfigError(
            "--param_device=%s: in a cluster the variables live on the ps tasks (placed "
            "by byte size), not on a worker's devices. Leave --param_device at its "
            "default (cpu); it only matters on one machine." % config.param_device
        )
    try:
        cluster_lib.check_bn_mode_for_cluster(config.bn_mode, cluster)
    except ValueError as e:
        raise ConfigError("--bn_mode=%s: %s" % (config.bn_mode, e)) from e
    per_worker, rest = divmod(config.global_batch_size, workers)
    if rest:
        lower = config.global_batch_size - rest
        raise ConfigError(
            "--global_batch_size=%d does not divide over the %d workers of this cluster: "
            "each worker trains on global_batch_size / workers examples per step (equal "
            "shares keep one step the mean over the global batch). Use a multiple of %d, "
            "e.g. %s%d."
            % (
                config.global_batch_size,
                workers,
                workers,
                "%d or " % lower if lower else "",
                lower + workers,
            )
        )
    if config.compute_dtype == "float16":
        raise ConfigError(
            "--compute_dtype=float16 in a cluster: a worker that skips a step whose "
            "gradients overflow (loss scaling) sends no gradients, and the others would "
            "wait for it. Fix: --compute_dtype=bfloat16 (no loss scaling) or float32."
        )
    needed = config.accumulation_steps * towers_per_worker
    if per_worker >= towers_per_worker and per_worker < needed:
        raise ConfigError(
            "--global_batch_size=%d gives each of the %d workers %d examples per step, "
            "split into --accumulation_steps=%d micro-batches over its %d towers: it needs "
            "at least %d x %d = %d. Use --global_batch_size >= %d, or fewer "
            "--accumulation_steps or --num_towers."
            % (config.global_batch_size, workers, per_worker, config.accumulation_steps,
               towers_per_worker, config.accumulation_steps, towers_per_worker, needed,
               workers * needed)
        )
    if per_worker < towers_per_worker:
        raise ConfigError(
            "--global_batch_size=%d gives each of the %d workers %d example(s) per step, "
            "fewer than its %d towers: every tower needs at least one. Use "
            "--global_batch_size >= %d, or fewer --num_towers."
            % (
                config.global_batch_size,
                workers,
                per_worker,
                towers_per_worker,
                workers * towers_per_worker,
            )
        )
    return per_worker


def save(config: TrainConfig, train_dir: str) -> str:
    """Writes the config to train_dir/train_config.json atomically; returns the path."""
    os.makedirs(train_dir, exist_ok=True)
    path = os.path.join(train_dir, CONFIG_FILE)
    text = json.dumps(dataclasses.asdict(config), indent=2, sort_keys=True)
    durable_files.atomic_write_text(path, text)  # fsynced, renamed into place
    return path


def load(train_dir: str) -> TrainConfig:
    """Reads train_dir/train_config.json.

    Raises:
      ConfigError: there is none (the folder was not written by train.py), or it is damaged.
    """
    path = os.path.join(train_dir, CONFIG_FILE)
    if not os.path.isfile(path):
        raise ConfigError(
            "No %s in --train_dir=%r: it was not written by examples/cifar10/train.py (or "
            "training has not started). Fix: point --train_dir at a training run's folder."
            % (CONFIG_FILE, train_dir)
        )
    try:
        with open(path) as f:
            values = json.load(f)
        known = {field.name for field in dataclasses.fields(TrainConfig)}
        return TrainConfig(**{k: v for k, v in values.items() if k in known})
    except (ValueError, TypeError) as e:
        raise ConfigError(
            "%s is damaged (%s). Fix: retrain into a fresh --train_dir." % (path, e)
        ) from e


def check_compatible_with_saved(config: TrainConfig) -> None:
    """Refuses to continue a run in train_dir with a different model or weight EMA, whose
    checkpoint could not be restored into the new graph."""
    path = os.path.join(config.train_dir, CONFIG_FILE)
    if not os.path.isfile(path):
        return
    saved = load(config.train_dir)
    if saved.model != config.model:
        raise ConfigError(
            "--train_dir=%r holds a run of --model=%s; this run asks for --model=%s, whose "
            "variables its checkpoint does not have. Fix: use a new --train_dir, or "
            "--model=%s to continue that run."
            % (config.train_dir, saved.model, config.model, saved.model)
        )
    if saved.ema_decay is None and config.ema_decay is not None:
        raise ConfigError(
            "--train_dir=%r holds a run trained without --ema_decay; its checkpoint has no "
            "moving averages to continue. Fix: use a new --train_dir, or drop --ema_decay."
            % config.train_dir
        )

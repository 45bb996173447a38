"""The command-line flags of the CIFAR-10 scripts (absl), in groups.

Each script defines the groups it uses; main.py, which runs them all, defines every group.
A group defined twice is defined once (so importing train.py from main.py is harmless).
Values are checked by config.check, not here, so that the error messages are the
example's own and name the fix.
"""

import dataclasses

from absl import flags

from examples.cifar10 import config as config_lib
from examples.cifar10 import download
from towerlib import cluster as cluster_lib

FLAGS = flags.FLAGS
_DEFAULTS = config_lib.TrainConfig()
# String flags whose empty value stands for None in TrainConfig ("not set").
_EMPTY_MEANS_UNSET = (
    "data_dir",
    "augmentation",
    "device_type",
    "sync_transport",
    "param_device",
    "loss_scale",
)


def _define(define_fn, name, default, help_text, **kwargs):
    if name not in FLAGS:
        define_fn(name, default, help_text, **kwargs)


def define_train_dir_flag():
    _define(
        flags.DEFINE_string,
        "train_dir",
        _DEFAULTS.train_dir,
        "Folder for checkpoints, TensorBoard events and train_config.json.",
    )


def define_data_flags():
    define_train_dir_flag()
    _define(
        flags.DEFINE_string,
        "data_dir",
        "",
        "Folder holding cifar-10-batches-bin/ (or the .bin files). Empty: the built-in "
        "generated data set, written under <train_dir>/generated_data (eval: the "
        "folder the run trained on).",
    )


def define_download_flags():
    _define(
        flags.DEFINE_bool,
        "download",
        False,
        "Fetch and extract the CIFAR-10 binary archive into --data_dir first, unless a "
        "complete copy is there.",
    )
    _define(
        flags.DEFINE_string,
        "download_url",
        download.DEFAULT_URL,
        "Where --download fetches the .tar.gz from.",
    )


def define_train_flags():
    """One flag per TrainConfig field, of the field's name (see train_config_from_flags)."""
    define_data_flags()
    define_download_flags()
    d = _DEFAULTS
    _define(
        flags.DEFINE_string,
        "model",
        d.model,
        "convnet (the tutorial network) or resnet20/32/44/56/110 (any 6n+2 depth).",
    )
    _define(
        flags.DEFINE_string,
        "augmentation",
        "",
        "tutorial (crop, flip, brightness, contrast) or resnet (pad 4, crop, flip); "
        "empty: the model's own (tutorial for convnet, resnet for the ResNets).",
    )
    _define(
        flags.DEFINE_integer,
        "num_towers",
        d.num_towers,
        "Towers (model replicas): GPUs, or virtual CPU devices when there are none. "
        "0: one per GPU (one CPU tower when there is no GPU).",
    )
    _define(
        flags.DEFINE_string,
        "device_type",
        "",
        "gpu or cpu; empty: GPUs when the machine has them, else CPUs.",
    )
    _define(
        flags.DEFINE_integer,
        "global_batch_size",
        d.global_batch_size,
        "Examples per optimizer step over ALL towers (each tower gets an equal share, "
        "the first ones one more when it does not divide).",
    )
    _define(
        flags.DEFINE_string,
        "bn_mode",
        d.bn_mode,
        "Batch norm across towers: first_tower (moving statistics from tower 0), "
        "all_towers (from the whole global batch), sync (also normalize with it).",
    )
    _define(
        flags.DEFINE_string,
        "sync_transport",
        d.sync_transport or "",
        "With --bn_mode=sync or --variable_update=replicated, how towers exchange "
        "statistics and gradients: graph or collective. Empty: collective (NCCL) when "
        "every tower is a GPU, graph otherwise.",
    )
    _define(
        flags.DEFINE_float,
        "bn_momentum",
        d.bn_momentum,
        "Decay of the batch-norm moving statistics used for evaluation.",
    )
    _define(
        flags.DEFINE_string,
        "param_device",
        d.param_device or "",
        "With --variable_update=parameter_server, where variables live: cpu (host) or "
        "gpu (spread over the tower GPUs). Empty: cpu. Not with replicated.",
    )
    _define(
        flags.DEFINE_string,
        "variable_update",
        d.variable_update,
        "parameter_server (one copy of every variable, gradients summed on its device) "
        "or replicated (a copy per tower on its own device, gradients all-reduced; one "
        "machine only).",
    )
    _define(
        flags.DEFINE_integer,
        "gradient_pack_bytes",
        d.gradient_pack_bytes,
        "With --variable_update=replicated, dense gradients are packed into all-reduce "
        "buffers of at most this many bytes (0: one all-reduce per gradient).",
    )
    _define(
        flags.DEFINE_string,
        "compute_dtype",
        d.compute_dtype,
        "float32, float16 or bfloat16: the dtype the towers compute in. The weights, "
        "the loss, the batch-norm statistics and the checkpoints stay float32.",
    )
    _define(
        flags.DEFINE_string,
        "loss_scale",
        "",
        "With --compute_dtype=float16 only: dynamic, or a number (a fixed scale). Empty: "
        "towerlib's default (dynamic with float16).",
    )
    _define(
        flags.DEFINE_integer,
        "accumulation_steps",
        d.accumulation_steps,
        "k >= 1: each optimizer step sums the gradients of k micro-batches (the global "
        "batch split k ways, each over the towers); the global batch must hold at least "
        "k x towers examples.",
    )
    _define(flags.DEFINE_string, "optimizer", d.optimizer, "sgd or momentum.")
    _define(flags.DEFINE_float, "momentum", d.momentum, "Momentum of --optimizer=momentum.")
    _define(
        flags.DEFINE_float,
        "learning_rate",
        d.learning_rate,
        "Base learning rate (for a global batch of 128 when --scale_lr_with_batch).",
    )
    _define(
        flags.DEFINE_bool,
        "scale_lr_with_batch",
        d.scale_lr_with_batch,
        "Multiply --learning_rate by global_batch_size / 128 (linear scaling rule).",
    )
    _define(
        flags.DEFINE_list,
        "lr_decay_epochs",
        [],
        "Epochs at which the learning rate is multiplied by --lr_decay_factor, e.g. "
        "100,150. Epochs count global batches: steps = epochs * examples / global batch.",
    )
    _define(
        flags.DEFINE_float,
        "lr_decay_factor",
        d.lr_decay_factor,
        "Multiplier of the learning rate at each of --lr_decay_epochs.",
    )
    _define(
        flags.DEFINE_float,
        "warmup_epochs",
        d.warmup_epochs,
        "Epochs of linear learning-rate warm-up (useful with large global batches).",
    )
    _define(
        flags.DEFINE_float,
        "weight_decay",
        None,
        "L2 weight decay; unset: the model's own (0.004 convnet, 2e-4 ResNets).",
    )
    _define(
        flags.DEFINE_float,
        "ema_decay",
        None,
        "Keep an exponential moving average of the weights with this decay (e.g. "
        "0.999); eval and export then use the averaged weights. Unset: none.",
    )
    _define(
        flags.DEFINE_integer,
        "max_steps",
        d.max_steps,
        "Global step to stop at (a restarted run continues up to it).",
    )
    _define(
        flags.DEFINE_float,
        "train_epochs",
        d.train_epochs,
        "If > 0, train this many epochs instead of --max_steps.",
    )
    _define(
        flags.DEFINE_integer,
        "log_every_n_steps",
        d.log_every_n_steps,
        "Log step, loss, examples/sec and sec/batch this often.",
    )
    _define(
        flags.DEFINE_integer,
        "save_checkpoint_steps",
        d.save_checkpoint_steps,
        "Checkpoint this often (and always at the end).",
    )
    _define(
        flags.DEFINE_integer,
        "save_summaries_steps",
        d.save_summaries_steps,
        "Write TensorBoard summaries this often.",
    )
    _define(
        flags.DEFINE_integer,
        "seed",
        None,
        "Seeds the weights, the shuffle order and the augmentation: two runs with one "
        "seed repeat bit for bit on CPU, interrupted or not (unset: random).",
    )
    _define(
        flags.DEFINE_bool,
        "overwrite_train_dir",
        False,
        "Delete the run already in --train_dir (checkpoints, events, train_config.json, "
        "eval/, export/) and start over. Without it, flags that describe another run "
        "than the recorded one are refused.",
    )


def define_cluster_flags():
    """Training on several machines (train.py only; see docs/distributed.md)."""
    _define(
        flags.DEFINE_string,
        "ps_hosts",
        "",
        "Comma-separated host:port of the parameter-server tasks. Empty (with "
        "--worker_hosts and --job_name, and no TF_CONFIG): train on this machine only.",
    )
    _define(
        flags.DEFINE_string,
        "worker_hosts",
        "",
        "Comma-separated host:port of the worker tasks; worker 0 is the chief.",
    )
    _define(flags.DEFINE_string, "job_name", "", "This task's job: ps or worker.")
    _define(flags.DEFINE_integer, "task_index", 0, "This task's index within its job.")
    _define(
        flags.DEFINE_float,
        "startup_timeout_secs",
        600.0,
        "A worker gives up when the ps tasks do not answer (or, for a non-chief, the "
        "chief has not initialized the model) within this long.",
    )
    _define(
        flags.DEFINE_float,
        "ps_timeout_secs",
        0.0,
        "A ps task gives up when the workers have not all finished within this long "
        "(0: it waits for them as long as it takes).",
    )


def cluster_from_flags():
    """The cluster that the cluster flags or TF_CONFIG describe; None on one machine.

    Raises:
      ConfigError: a malformed or contradictory description, naming what to fix.
    """
    try:
        return cluster_lib.resolve_cluster(
            FLAGS.ps_hosts, FLAGS.worker_hosts, FLAGS.job_name, FLAGS.task_index
        )
    except (ValueError, TypeError) as e:
        raise config_lib.ConfigError(str(e)) from e


def define_eval_flags():
    define_data_flags()
    _define(
        flags.DEFINE_string,
        "eval_dir",
        "",
        "Folder for the evaluation TensorBoard events; empty: <train_dir>/eval.",
    )
    _define(flags.DEFINE_integer, "eval_batch_size", 500, "Examples per evaluation batch.")
    _define(
        flags.DEFINE_integer,
        "num_towers",
        None,
        "Towers to split each evaluation batch over (GPUs, or virtual CPU devices when "
        "there are none). Unset: as many as the run trained on.",
    )
    _define(
        flags.DEFINE_bool,
        "continuous",
        False,
        "Evaluate every new checkpoint as it appears, until training reaches its last "
        "step or --eval_timeout_secs pass without a new one.",
    )
    _define(
        flags.DEFINE_integer,
        "eval_interval_secs",
        30,
        "With --continuous: at least this long between evaluations.",
    )
    _define(
        flags.DEFINE_integer,
        "eval_timeout_secs",
        600,
        "With --continuous: stop after this long without a new checkpoint.",
    )


def define_export_flags():
    define_train_dir_flag()
    _define(
        flags.DEFINE_string,
        "export_dir",
        "",
        "Folder for SavedModels (one numbered by global step per export); empty: "
        "<train_dir>/export.",
    )


def train_config_from_flags() -> config_lib.TrainConfig:
    """The TrainConfig the parsed flags describe: each field from the flag of its name."""
    values = {
        field.name: getattr(FLAGS, field.name)
        for field in dataclasses.fields(config_lib.TrainConfig)
    }
    for name in _EMPTY_MEANS_UNSET:
        values[name] = values[name] or None
    try:
        values["lr_decay_epochs"] = [float(e) for e in FLAGS.lr_decay_epochs]
    except ValueError as e:
        raise config_lib.ConfigError(
            "--lr_decay_epochs=%s: give numbers separated by commas, "
            "e.g. 100,150." % ",".join(FLAGS.lr_decay_epochs)
        ) from e
    return config_lib.TrainConfig(**values)

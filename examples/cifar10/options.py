"""The scripts' command-line flags (absl), defined from tables, and their errors.

Each script defines the groups it uses (main.py the train group); a flag defined twice is
defined once. A script reads the flags given on its command line (`given`) and the
defaults; the job (job.py) resolves the rest from the run recorded in --train_dir
(run_folder). Values are checked where they are used: towerlib's options by
towerlib.validate_config (job.check_flags), the example's own (--model, the schedule, the
data) here; either way the script stops with one line naming the flag and the fix
(FlagError).

This module does not import TensorFlow (nor towerlib, which does): a script answers --help
from these tables before TensorFlow loads (command_line.parse_flags_before_tensorflow).
"""

import contextlib
import math
import os
import types

from absl import flags

from examples.cifar10 import default_dirs, download

# towerlib.Replicated().pack_bytes, without importing towerlib (a test compares them).
REPLICATED_PACK_BYTES = 4 << 20

FLAGS = flags.FLAGS


class FlagError(ValueError):
    """A flag, or flags together, that cannot work: one line naming the flag and the fix."""


def shown(value) -> str:
    """A flag's value as it is typed on the command line."""
    if isinstance(value, (list, tuple)):
        return ",".join(shown(v) for v in value)
    if isinstance(value, float):
        return "%g" % value
    return "" if value is None else str(value)


def flag_error(flag, value, problem, fix="") -> FlagError:
    """error: --flag=value: problem Fix: fix."""
    return FlagError("--%s=%s: %s%s" % (flag, shown(value), problem,
                                        " Fix: " + fix if fix else ""))


@contextlib.contextmanager
def blamed_on(flags_, flag):
    """A towerlib object checks its arguments when it is made: its refusal names `flag`."""
    try:
        yield
    except ValueError as error:
        raise flag_error(flag, getattr(flags_, flag), str(error)) from None


# The train flags: (define function, name, default, help). main.py changes some defaults.
TRAIN_FLAGS = (
    (flags.DEFINE_string, "train_dir", default_dirs.default_train_dir("train"),
     "Folder for checkpoints, TensorBoard events and train_config.json (one run)."),
    (flags.DEFINE_string, "data_dir", "",
     "Folder holding cifar-10-batches-bin/. Empty: the built-in generated data set, "
     "written under <train_dir>/generated_data."),
    (flags.DEFINE_bool, "download", False,
     "Fetch the CIFAR-10 binary archive into --data_dir first, unless a complete copy is "
     "there."),
    (flags.DEFINE_string, "download_url", download.DEFAULT_URL,
     "Where --download fetches from."),
    (flags.DEFINE_string, "model", "convnet",
     "convnet (the tutorial network), resnet20/32/44/56/110 (any 6n+2 depth), or "
     "keras_resnet20 (the same ResNet as a tf_keras model; needs tf_keras)."),
    (flags.DEFINE_string, "augmentation", "",
     "tutorial or resnet; empty: the model's own (tutorial for convnet, resnet for ResNets)."),
    (flags.DEFINE_integer, "num_towers", 0,
     "Towers: GPUs, or virtual CPU devices when there are none. 0: one per GPU, else 1."),
    (flags.DEFINE_string, "device_type", "", "gpu or cpu; empty: GPUs when there are any."),
    (flags.DEFINE_integer, "global_batch_size", 128,
     "Examples per optimizer step over ALL towers (uneven splits are fine)."),
    (flags.DEFINE_string, "bn_mode", "first_tower",
     "Batch norm across towers: first_tower, all_towers or sync (towerlib's modes)."),
    (flags.DEFINE_string, "sync_transport", "",
     "With --bn_mode=sync or --variable_update=replicated: graph or collective "
     "(towerlib.GraphExchange, CollectiveExchange). Empty: collective on GPUs, else graph."),
    (flags.DEFINE_float, "bn_momentum", 0.9,
     "Decay of the batch-norm moving statistics that eval and export use (0.9: after 30 "
     "steps 96% of them come from the data)."),
    (flags.DEFINE_string, "variable_update", "parameter_server",
     "parameter_server (towerlib.ParameterServer; on a cluster, through its ps tasks) or "
     "replicated (towerlib.Replicated; on a cluster without ps tasks, all-reduced across "
     "every worker's towers)."),
    (flags.DEFINE_string, "param_device", "",
     "With parameter_server: cpu or gpu (ParameterServer(device=...)). Empty: cpu."),
    (flags.DEFINE_integer, "gradient_pack_bytes", REPLICATED_PACK_BYTES,
     "With replicated: all-reduce buffer size in bytes (Replicated(pack_bytes=...); "
     "0: one all-reduce per gradient)."),
    (flags.DEFINE_string, "compute_dtype", "float32",
     "float32, bfloat16 or float16 (towerlib.Float32, BFloat16, Float16): the towers' "
     "arithmetic; weights, loss and checkpoints stay float32."),
    (flags.DEFINE_string, "loss_scale", "",
     "With float16: dynamic or a number (Float16(loss_scale=...)). Empty: dynamic."),
    (flags.DEFINE_integer, "accumulation_steps", 1,
     "k: each optimizer step sums the gradients of k micro-batches of the global batch."),
    (flags.DEFINE_string, "optimizer", "momentum", "sgd or momentum."),
    (flags.DEFINE_float, "momentum", 0.9, "Momentum of --optimizer=momentum."),
    (flags.DEFINE_float, "learning_rate", 0.01,
     "Base learning rate (for a global batch of 128 with --scale_lr_with_batch); the "
     "convnet stalls at chance from 0.05 on, the ResNets take 0.1."),
    (flags.DEFINE_bool, "scale_lr_with_batch", False,
     "Multiply --learning_rate by global_batch_size / 128."),
    (flags.DEFINE_list, "lr_decay_epochs", [],
     "Epochs (of global batches) at which the rate is multiplied by --lr_decay_factor."),
    (flags.DEFINE_float, "lr_decay_factor", 0.1, "Multiplier at each of --lr_decay_epochs."),
    (flags.DEFINE_float, "warmup_epochs", 0.0, "Epochs of linear learning-rate warm-up."),
    (flags.DEFINE_float, "weight_decay", None,
     "L2 weight decay; unset: the model's own (0.004 convnet, 2e-4 ResNets)."),
    (flags.DEFINE_float, "ema_decay", None,
     "Keep a moving average of the weights (e.g. 0.999); eval and export use it."),
    (flags.DEFINE_integer, "max_steps", 1000, "Global step to stop at."),
    (flags.DEFINE_float, "train_epochs", 0.0, "If > 0, train this many epochs instead."),
    (flags.DEFINE_integer, "log_every_n_steps", 50, "Log step, loss and speed this often."),
    (flags.DEFINE_integer, "save_checkpoint_steps", 500,
     "Checkpoint this often (and at the end)."),
    (flags.DEFINE_integer, "save_summaries_steps", 50,
     "Write TensorBoard summaries this often."),
    (flags.DEFINE_integer, "seed", None,
     "Seeds the weights, the shuffle and the augmentation: runs repeat bit for bit on CPU."),
    (flags.DEFINE_bool, "overwrite_train_dir", False,
     "Delete the run in --train_dir (checkpoints, events, train_config.json, eval/, "
     "export/) and start over."),
    (flags.DEFINE_list, "trace_steps", [],
     "Global steps to trace, e.g. 20,21: TensorBoard run metadata, a Chrome trace and a "
     "PNG in <train_dir>/traces, and one log line on how the towers overlapped."),
)
TRAIN_FLAG_NAMES = tuple(name for _, name, _, _ in TRAIN_FLAGS)

CLUSTER_FLAGS = (
    (flags.DEFINE_string, "ps_hosts", "", "Comma-separated host:port of the ps tasks."),
    (flags.DEFINE_string, "worker_hosts", "",
     "Comma-separated host:port of the workers; worker 0 is the chief."),
    (flags.DEFINE_string, "job_name", "", "This task's job: ps or worker."),
    (flags.DEFINE_integer, "task_index", 0, "This task's index within its job."),
    (flags.DEFINE_float, "startup_timeout_secs", 600.0,
     "A worker gives up when the ps tasks (or the chief) do not answer within this long."),
    (flags.DEFINE_float, "ps_timeout_secs", 0.0,
     "A ps task gives up when the workers have not all finished within this long (0: never)."),
)

EVAL_FLAGS = (
    (flags.DEFINE_string, "train_dir", default_dirs.default_train_dir("train"),
     "The training run's folder."),
    (flags.DEFINE_string, "data_dir", "", "Test data folder; empty: the run's own."),
    (flags.DEFINE_string, "eval_dir", "",
     "Folder for the evaluation events; empty: <train_dir>/eval, or none when that "
     "cannot be written (a read-only run folder: the precision is still printed)."),
    (flags.DEFINE_integer, "eval_batch_size", 500, "Examples per evaluation batch."),
    (flags.DEFINE_integer, "num_towers", None,
     "Towers to split each batch over; unset: as many as the run trained on."),
    (flags.DEFINE_bool, "continuous", False,
     "Evaluate each new checkpoint until the run's last step (or --eval_timeout_secs)."),
    (flags.DEFINE_integer, "eval_interval_secs", 30,
     "With --continuous: seconds between passes."),
    (flags.DEFINE_integer, "eval_timeout_secs", 600,
     "With --continuous: stop after this long without a new checkpoint."),
)

EXPORT_FLAGS = (
    (flags.DEFINE_string, "train_dir", default_dirs.default_train_dir("train"),
     "The training run's folder."),
    (flags.DEFINE_string, "export_dir", "",
     "Folder for SavedModels, one per global step; empty: <train_dir>/export."),
    (flags.DEFINE_bool, "overwrite", False,
     "Replace <export_dir>/<step> even when it holds files this script did not write."),
)


def define(table):
    for define_fn, name, default, help_text in table:
        if name not in FLAGS:
            define_fn(name, default, help_text)


def given(names=TRAIN_FLAG_NAMES) -> dict:
    """{name: value} of the flags given on the command line."""
    return {name: FLAGS[name].value for name in names if FLAGS[name].present}


def defaults(names=TRAIN_FLAG_NAMES) -> dict:
    """{name: default} of the flags (main.py's defaults where it changed them)."""
    return {name: FLAGS[name].default for name in names}


def train_defaults() -> dict:
    return {name: default for _, name, default, _ in TRAIN_FLAGS}


def normalized(values: dict) -> dict:
    """The flags' values as the scripts use them: lists of numbers, '' for unset strings."""
    values = dict(values)
    for name in ("data_dir", "augmentation", "device_type", "sync_transport",
                 "param_device", "loss_scale"):
        values[name] = "" if values.get(name) is None else str(values[name])
    try:
        values["lr_decay_epochs"] = [float(e) for e in values.get("lr_decay_epochs") or []]
    except ValueError:
        raise flag_error("lr_decay_epochs", values["lr_decay_epochs"],
                         "give numbers separated by commas, e.g. 100,150.") from None
    # Whole numbers become ints; anything else goes on as it is, for towerlib to refuse.
    values["trace_steps"] = [int(s) if str(s).isdigit() else s
                             for s in values.get("trace_steps") or []]
    return values


# Flags that are an argument of one strategy object: with another strategy chosen they
# would be ignored, so they are refused. flag: (the flag that chooses, its value, object).
ARGUMENT_OF = {
    "param_device": ("variable_update", "parameter_server", "towerlib.ParameterServer"),
    "gradient_pack_bytes": ("variable_update", "replicated", "towerlib.Replicated"),
    "loss_scale": ("compute_dtype", "float16", "towerlib.Float16"),
}


def refuse_unused_strategy_flags(flags_):
    """Refuses a strategy's argument given (not its default) with another strategy."""
    defaults_ = train_defaults()
    for flag, (chooser, choice, strategy) in ARGUMENT_OF.items():
        value = getattr(flags_, flag)
        if value not in ("", defaults_[flag]) and getattr(flags_, chooser) != choice:
            raise flag_error(
                flag, value, "it is an argument of %s, which --%s=%s does not choose." % (
                    strategy, chooser, getattr(flags_, chooser)),
                "drop --%s, or use --%s=%s." % (flag, chooser, choice))


def check_own_flags(flags_, make_model):
    """The example's own flags, which are no towerlib option: the model, the augmentation,
    the optimizer, the schedule, the data. Returns the model; raises FlagError."""
    from examples.cifar10 import input_pipeline, schedule  # TensorFlow's modules
    if flags_.seed is not None and not 0 <= flags_.seed < 2**32:
        raise flag_error("seed", flags_.seed, "the seed must be an integer in "
                         "0..4294967295.", "e.g. --seed=1.")
    try:
        model = make_model(flags_.model, flags_.weight_decay, flags_.bn_momentum)
    except ValueError as error:
        raise flag_error("model", flags_.model, str(error)) from None
    if flags_.augmentation and flags_.augmentation not in input_pipeline.AUGMENTATIONS:
        raise flag_error("augmentation", flags_.augmentation, "choose one of %s, or leave "
                         "it empty for the model's own."
                         % ", ".join(input_pipeline.AUGMENTATIONS))
    if flags_.optimizer not in ("sgd", "momentum"):
        raise flag_error("optimizer", flags_.optimizer, "choose sgd or momentum.")
    problem = schedule.settings_problem(flags_.learning_rate, flags_.lr_decay_epochs,
                                        flags_.lr_decay_factor, flags_.warmup_epochs)
    if problem:
        raise flag_error(*problem)
    if not 0 < flags_.bn_momentum < 1:
        raise flag_error("bn_momentum", flags_.bn_momentum, "use a value in (0, 1), e.g. 0.9.")
    if flags_.weight_decay is not None and not 0 <= flags_.weight_decay < math.inf:
        raise flag_error("weight_decay", flags_.weight_decay, "use a finite value >= 0, "
                         "e.g. 1e-4 (0 for none).")
    if flags_.optimizer == "momentum" and not 0 <= flags_.momentum < 1:  # NaN too
        raise flag_error("momentum", flags_.momentum, "use a value in [0, 1), e.g. 0.9 "
                         "(1 or more makes the weights diverge).")
    if not math.isfinite(flags_.train_epochs) or flags_.train_epochs < 0:
        raise flag_error("train_epochs", flags_.train_epochs, "use a number of epochs >= 0.")
    if flags_.download and not flags_.data_dir:
        raise flag_error("download", True, "it needs --data_dir, the folder to put "
                         "cifar-10-batches-bin/ in.", "e.g. --data_dir=/tmp/cifar10_data.")
    if flags_.download:
        check_download_flags(flags_.download_url, flags_.data_dir)
    return model


def check_download_flags(url, data_dir):
    """A download's URL and folder, refused in one line before anything is fetched."""
    if url.split("://")[0].lower() not in ("http", "https", "file") or "://" not in url:
        raise flag_error("download_url", url, "it is not an http://, https:// or file:// "
                         "URL.", "e.g. --download_url=%s." % download.DEFAULT_URL)
    if os.path.exists(data_dir) and not os.path.isdir(data_dir):
        raise flag_error("data_dir", data_dir, "it is a file; --download puts "
                         "cifar-10-batches-bin/ in a folder.",
                         "give a folder (it is created if missing).")


def namespace(values: dict) -> types.SimpleNamespace:
    return types.SimpleNamespace(**values)


def cluster_from_flags():
    """The cluster the cluster flags (or TF_CONFIG) describe; None on one machine."""
    import towerlib  # not at the top: --help answers before TensorFlow loads

    try:
        return towerlib.cluster.resolve_cluster(
            FLAGS.ps_hosts, FLAGS.worker_hosts, FLAGS.job_name, FLAGS.task_index)
    except (ValueError, TypeError) as error:
        raise FlagError(str(error)) from None

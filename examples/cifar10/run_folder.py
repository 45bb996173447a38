"""The run's folder (--train_dir): does it hold THIS run, and may it be written?

A train_dir holds one run: its checkpoints, its train_config.json, its events. Before
anything is written, training checks that the folder can take it:

- the folder is a writable directory (or can be created);
- the run recorded in train_config.json is the run the flags describe: same data, model,
  optimizer, schedule, seed, and (unless batch norm is synchronized) tower count. Anything
  else would continue a different run from its checkpoint, or, when that run is
  finished, report the old model as the result of the new flags. A difference is refused
  in one line naming each setting and the fix: a new --train_dir, or
  --overwrite_train_dir to start over in this one;
- once the graph is built, the checkpoint to restore holds every variable of the graph
  with its shape (catches a folder whose train_config.json is missing).

Only then is train_config.json written (atomically). `start_over` removes what a run
wrote, keeping the generated data set.
"""

import dataclasses
import logging
import os
import shutil
from typing import List, Optional

import tensorflow as tf

import towerlib
from towerlib.run import checkpoints
from examples.cifar10 import config as config_lib
from examples.cifar10 import data_source

logger = logging.getLogger("cifar10")

# The settings that make two runs the same computation. The step to stop at, logging,
# summaries and checkpoint intervals may change between the lives of one run, and so may
# where variables live and how gradients travel (--variable_update, --param_device,
# --sync_transport, --gradient_pack_bytes): checkpoints hold the same names either way.
SAME_RUN_SETTINGS = (
    "data_dir",
    "model",
    "augmentation",
    "global_batch_size",
    "bn_mode",
    "bn_momentum",
    "compute_dtype",
    "loss_scale",
    "accumulation_steps",
    "optimizer",
    "momentum",
    "learning_rate",
    "scale_lr_with_batch",
    "lr_decay_epochs",
    "lr_decay_factor",
    "warmup_epochs",
    "weight_decay",
    "ema_decay",
    "train_epochs",
    "seed",
)


def _comparable(config: config_lib.TrainConfig, name: str):
    value = getattr(config, name)
    if name == "data_dir":
        # Unset, or recorded as <some train_dir>/generated_data: the generated set.
        if value is None or os.path.basename(os.path.normpath(value)) == (
            data_source.GENERATED_SUBDIR
        ):
            return "the generated data"
        return os.path.abspath(value)
    if name == "lr_decay_epochs":
        return [float(e) for e in value]
    return value


def differences(
    saved: config_lib.TrainConfig, config: config_lib.TrainConfig
) -> List[str]:
    """'recorded --name=X, flags --name=Y' for each setting where the two runs differ."""
    names = list(SAME_RUN_SETTINGS)
    if config.bn_mode != "sync":  # each tower's statistics come from its share
        names.append("num_towers")
    found = []
    for name in names:
        recorded, asked = _comparable(saved, name), _comparable(config, name)
        if recorded != asked:
            found.append("recorded --%s=%s, flags --%s=%s" % (name, recorded, name, asked))
    return found


def check_writable(train_dir: str) -> None:
    """Refuses a train_dir that is a file, lies under a file, or cannot be written."""
    try:
        towerlib.validate_config(train_dir=train_dir)
    except towerlib.ConfigError as e:
        reasons = " ".join(p.problem for p in e.problems if p.option == "train_dir")
        raise config_lib.ConfigError(
            "--train_dir=%r: %s Fix: choose a writable folder." % (train_dir, reasons)
        ) from None


def check_flags_match_folder(config: config_lib.TrainConfig) -> None:
    """Refuses flags that describe another run than the one train_dir holds."""
    if not os.path.isfile(os.path.join(config.train_dir, config_lib.CONFIG_FILE)):
        return
    found = differences(config_lib.load(config.train_dir), config)
    if found:
        raise config_lib.ConfigError(
            "--train_dir=%r holds another run than these flags describe (%s). Fix: a new "
            "--train_dir, the recorded values to continue that run, or "
            "--overwrite_train_dir to delete it and start over."
            % (config.train_dir, "; ".join(found))
        )


def check_checkpoint_fits_graph(checkpoint: Optional[str], train_dir: str) -> None:
    """Refuses a checkpoint that lacks a variable of the default graph (or has it in
    another shape): the restore would fail deep in TensorFlow."""
    if checkpoint is None:
        return
    stored = dict(tf.train.list_variables(checkpoint))
    missing, reshaped = [], []
    for variable in tf.compat.v1.global_variables():
        name = variable.op.name
        if name not in stored:
            missing.append(name)
        elif list(stored[name]) != variable.shape.as_list():
            reshaped.append(
                "%s %s, not %s" % (name, stored[name], variable.shape.as_list())
            )
    for saveable in tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS):
        if not any(spec.name in stored for spec in saveable.specs):
            missing.append("%s (the data position)" % saveable.name)
    if missing or reshaped:
        problems = []
        if missing:
            problems.append(
                "it lacks %d variable(s) of this model, e.g. %s"
                % (len(missing), ", ".join(missing[:3]))
            )
        if reshaped:
            problems.append("shapes differ: %s" % ", ".join(reshaped[:3]))
        raise config_lib.ConfigError(
            "The checkpoint %s in --train_dir=%r is of another model or optimizer (%s). "
            "Fix: a new --train_dir, the flags of the run that wrote it, or "
            "--overwrite_train_dir to delete it and start over."
            % (checkpoint, train_dir, "; ".join(problems))
        )


def _is_run_file(name: str) -> bool:
    return (
        name.startswith("model.ckpt")
        or name.startswith("events.out.tfevents")
        or name.startswith(checkpoints.STATE_FILENAME)
        or name.startswith(config_lib.CONFIG_FILE)
        or name.startswith("." + config_lib.CONFIG_FILE)
        or name in (checkpoints.SAVING_DIRNAME, "eval", "export")
    )


def start_over(train_dir: str) -> List[str]:
    """Deletes the run in train_dir (checkpoints, state, events, train_config.json,
    eval/, export/), keeping anything else, e.g. the generated data; returns what went.
    train_config.json goes first, so an interrupted start-over is never resumed."""
    if not os.path.isdir(train_dir):
        return []
    names = sorted(n for n in os.listdir(train_dir) if _is_run_file(n))
    names.sort(key=lambda n: not n.startswith(config_lib.CONFIG_FILE))
    for name in names:
        path = os.path.join(train_dir, name)
        if os.path.isdir(path):
            shutil.rmtree(path)
        else:
            os.remove(path)
    if names:
        logger.info(
            "--overwrite_train_dir: deleted the previous run in %s (%d files and folders).",
            train_dir,
            len(names),
        )
    return names


def record(config: config_lib.TrainConfig, data_dir: str, max_steps: int) -> str:
    """Writes train_dir/train_config.json (atomically) for eval, export and restarts:
    the flags, with the data folder and the last step actually used."""
    return config_lib.save(
        dataclasses.replace(config, data_dir=data_dir, max_steps=max_steps),
        config.train_dir,
    )

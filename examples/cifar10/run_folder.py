"""The run's folder (--train_dir): one run, recorded in train_config.json.

- A restart continues the recorded run: flags NOT given on the command line come from
  train_config.json (`resolve_flags`), so `train --train_dir=<run> --max_steps=2000` is
  enough; only given flags that describe another run (data, model, batch, schedule, seed,
  and the tower count unless --bn_mode=sync) are refused, in one line naming each
  difference and the fix (a new --train_dir, or --overwrite_train_dir).
- Once the graph is built, the checkpoint to restore must hold every variable of the graph
  with its shape (catches a folder whose train_config.json is missing).
- Only then is train_config.json written (`record`, atomically). `start_over` removes
  exactly what a run wrote (by name), in a folder holding a run record only: never a
  user's files, and not while another trainer holds the folder.
- The event files and traces a run writes have names a user's file can have too
  (`events.out.tfevents.mine`), so no pattern decides they are the run's: each life of
  the run (train, eval) records in .train_files.json the exact names that appeared while
  it ran (`claiming`), and `start_over` deletes those and no other. A life killed before
  its end records nothing: its events stay, and so do those of runs recorded before this
  record existed (delete them by hand).
"""

import contextlib
import json
import logging
import os
import re
import shutil
import socket
import tempfile
import time
from typing import List, Optional

import tensorflow as tf

import towerlib
import towerlib.run.checkpoints
from examples.cifar10 import data_source, options, run_errors
from towerlib.run import checkpoint_state, folder_lock, run_entries

logger = logging.getLogger("cifar10")

CONFIG_FILE = "train_config.json"
RUN_FILES = ".train_files.json"   # the exact names of the events and traces the run wrote
# Flags that belong to one life of a run, not to the run: never recorded.
NOT_RECORDED = ("overwrite_train_dir", "trace_steps")
RECORDED = tuple(n for n in options.TRAIN_FLAG_NAMES if n not in NOT_RECORDED)
# The settings that make two runs the same computation. The step to stop at, logging,
# summaries and checkpoint intervals may change between the lives of one run, and so may
# where variables live and how gradients travel (--variable_update, --param_device,
# --sync_transport, --gradient_pack_bytes): checkpoints hold the same names either way.
SAME_RUN_SETTINGS = (
    "data_dir", "model", "augmentation", "global_batch_size", "bn_mode", "bn_momentum",
    "compute_dtype", "loss_scale", "accumulation_steps", "optimizer", "momentum",
    "learning_rate", "scale_lr_with_batch", "lr_decay_epochs", "lr_decay_factor",
    "warmup_epochs", "weight_decay", "ema_decay", "train_epochs", "seed",
)


def load(train_dir: str):
    """The run recorded in train_dir, as a namespace of its flags (a flag newer than the
    record has its default).

    Raises:
      FlagError: there is none (not a run's folder), or it is damaged.
    """
    path = os.path.join(train_dir, CONFIG_FILE)
    if not os.path.isfile(path):
        raise options.FlagError(
            "No %s in --train_dir=%r: it was not written by examples/cifar10/train.py (or "
            "training has not started). Fix: point --train_dir at a training run's folder."
            % (CONFIG_FILE, train_dir))
    try:
        with open(path) as f:
            recorded = json.load(f)
        values = options.train_defaults()
        values.update({k: v for k, v in recorded.items() if k in RECORDED})
        return options.namespace(options.normalized(values))
    except (ValueError, TypeError, AttributeError) as e:
        raise options.FlagError(
            "%s is damaged (%s). Fix: retrain into a fresh --train_dir." % (path, e)) from None


def _comparable(values, name):
    value = getattr(values, name)
    if name == "data_dir":
        # Empty, or <some train_dir>/generated_data (older records): the generated set.
        if not value or os.path.basename(os.path.normpath(value)) == (
                data_source.GENERATED_SUBDIR):
            return "the generated data"
        return os.path.abspath(value)
    return value


def resolve_flags(given: dict, defaults: Optional[dict] = None):
    """The run's flags: those given, else the recorded run's, else the defaults.

    Args:
      given: {flag: value} of the flags given (on the command line, or by a caller).
      defaults: the flags' defaults (main.py has its own); None: the train script's.

    Raises:
      FlagError: a given flag describes another run than train_dir holds.
    """
    values = dict(defaults or options.train_defaults())
    values.update(given)
    values = options.normalized(values)
    train_dir = values["train_dir"]
    if values["overwrite_train_dir"] or not os.path.isfile(
            os.path.join(train_dir, CONFIG_FILE)):
        return options.namespace(values)
    recorded = load(train_dir)
    if "max_steps" in given and "train_epochs" not in given:
        recorded.train_epochs = 0.0  # a --max_steps given is where to stop
    asked = options.namespace(values)
    names = [n for n in SAME_RUN_SETTINGS if n in given]
    bn_mode = given.get("bn_mode", recorded.bn_mode)
    if "num_towers" in given and bn_mode != "sync":  # each tower's statistics its own
        names.append("num_towers")
    found = ["recorded --%s=%s, flags --%s=%s" % (n, options.shown(_comparable(recorded, n)),
                                                  n, options.shown(_comparable(asked, n)))
             for n in names if _comparable(recorded, n) != _comparable(asked, n)]
    if found:
        raise options.FlagError(
            "--train_dir=%r holds another run than these flags describe (%s). Fix: a new "
            "--train_dir, the recorded values (or no such flag) to continue that run, or "
            "--overwrite_train_dir to delete it and start over."
            % (train_dir, "; ".join(found)))
    for name in RECORDED:
        if name not in given:
            values[name] = getattr(recorded, name)
    values["train_dir"] = train_dir
    return options.namespace(values)


def refuse_if_in_use(train_dir: str) -> None:
    """Raises RunError (one line, naming the other trainer's pid) when another process
    trains into train_dir (towerlib's lock on the folder); nothing is held after."""
    if not os.path.isdir(train_dir):
        return
    try:
        folder_lock.hold(train_dir).release()
    except folder_lock.TrainDirInUseError as error:
        raise run_errors.RunError(str(error)) from None


def record(flags, data_dir: str, max_steps: int) -> str:
    """Writes train_dir/train_config.json atomically (fsynced, renamed into place) for
    eval, export and restarts: the flags, the data folder ('' for the generated set in
    train_dir) and the last step actually used. Refused while another trainer holds
    train_dir."""
    refuse_if_in_use(flags.train_dir)
    values = {name: getattr(flags, name) for name in RECORDED}
    values.update(data_dir="" if data_source.is_generated_dir(data_dir, flags.train_dir)
                  else data_dir, max_steps=max_steps)
    os.makedirs(flags.train_dir, exist_ok=True)
    return _write_json(flags.train_dir, CONFIG_FILE, values)


def restorable_checkpoint(train_dir: str) -> Optional[str]:
    """The checkpoint a (re)start restores, as towerlib chooses it: the newest that reads
    back completely (a torn newer one skipped), or None. Train, eval and export all ask
    this, never the state file alone."""
    return run_errors.restorable_checkpoint(train_dir)


def checkpoint_step(train_dir: str) -> int:
    """The global step of the checkpoint a restart restores, or 0 when there is none."""
    checkpoint = restorable_checkpoint(train_dir)
    return int(tf.train.load_variable(checkpoint, "global_step")) if checkpoint else 0


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
            reshaped.append("%s %s, not %s" % (name, stored[name], variable.shape.as_list()))
    for saveable in tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS):
        if not any(spec.name in stored for spec in saveable.specs):
            missing.append("%s (the data position)" % saveable.name)
    if missing and not reshaped and all(n.startswith("global_batches/") for n in missing):
        raise options.FlagError(
            "The checkpoint %s in --train_dir=%r was written with another input (the "
            "shuffled shards of a ps cluster, or of an older version of this example): it "
            "holds no position of the global batches this run reads. Fix: the same "
            "--ps_hosts as the run that wrote it, a new --train_dir, or "
            "--overwrite_train_dir to delete it and start over." % (checkpoint, train_dir))
    if missing or reshaped:
        problems = []
        if missing:
            problems.append("it lacks %d variable(s) of this model, e.g. %s"
                            % (len(missing), ", ".join(missing[:3])))
        if reshaped:
            problems.append("shapes differ: %s" % ", ".join(reshaped[:3]))
        raise options.FlagError(
            "The checkpoint %s in --train_dir=%r is of another model or optimizer (%s). "
            "Fix: a new --train_dir, the flags of the run that wrote it, or "
            "--overwrite_train_dir to delete it and start over."
            % (checkpoint, train_dir, "; ".join(problems)))


# The names a run of ours writes at the top of its folder that it also reads back (its
# checkpoints, their state, its records' temporaries): the run's by their format.
_RUN_FILE = re.compile(
    r"^(model\.ckpt-\d+\.(index|meta|data-\d{5}-of-\d{5})|checkpoint"
    r"|\.train_(config|files)\.json\w+)$")
# What a life of the run may write that nothing reads back, by folder: TensorFlow's event
# files (events.out.tfevents.<seconds, 10 digits>.<host>[suffix]) and the traces. Only
# the names a life recorded (`claiming`) are the run's.
_EVENTS = re.compile(r"^events\.out\.tfevents\.\d{10,}\..+$")
_EVENT_FIELDS = re.compile(r"^events\.out\.tfevents\.(\d{10,})\.(.+)$")
_CLAIMABLE = {"": _EVENTS, "eval": _EVENTS,
              "traces": re.compile(r"^trace_step_\d+\.(json|png)$")}
STARTING_OVER = "." + CONFIG_FILE + ".start_over"  # the record, while start_over runs


def _claimable(train_dir: str) -> set:
    """The names (relative to train_dir) of the files there a life of the run may write."""
    found = set()
    for folder, pattern in _CLAIMABLE.items():
        path = os.path.join(train_dir, folder)
        if not os.path.isdir(path) or os.path.islink(path):
            continue
        found.update(os.path.join(folder, name) for name in os.listdir(path)
                     if pattern.match(name) and os.path.isfile(os.path.join(path, name))
                     and not os.path.islink(os.path.join(path, name)))
    return found


def written_files(train_dir: str) -> set:
    """The exact names the run's lives recorded as theirs (RUN_FILES); empty if none."""
    try:
        with open(os.path.join(train_dir, RUN_FILES)) as f:
            names = json.load(f)
    except (OSError, ValueError):
        return set()
    return {n for n in names if isinstance(n, str) and ".." not in n.split(os.sep)}


def record_written(train_dir: str, names) -> None:
    """Adds `names` (relative to train_dir, e.g. 'export/8') to the run's record of what
    it wrote (RUN_FILES): `start_over` deletes what the record names, nothing else."""
    _write_json(train_dir, RUN_FILES, sorted(written_files(train_dir) | set(names)))


def _is_real_folder(path: str) -> bool:
    return os.path.isdir(path) and not os.path.islink(path)


def _staging_is_ours(train_dir: str) -> bool:
    """towerlib's .saving: a real folder holding only the names its writer gives."""
    path = os.path.join(train_dir, towerlib.run.checkpoints.SAVING_DIRNAME)
    if not _is_real_folder(path):
        return False
    try:
        run_entries.ours(path, checkpoint_state.staged_name)
    except run_entries.ControlEntryError:
        return False
    return True


def _write_json(train_dir: str, name: str, value) -> str:
    """train_dir/name holding `value`, written atomically (fsynced, renamed into place)."""
    path = os.path.join(train_dir, name)
    handle, staging = tempfile.mkstemp(dir=train_dir, prefix="." + name.lstrip("."))
    with os.fdopen(handle, "w") as f:
        json.dump(value, f, indent=2, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(staging, path)
    return path


@contextlib.contextmanager
def claiming(train_dir: str):
    """Records, in train_dir/RUN_FILES, the event files and traces that appear in train_dir
    while the block runs: one life of the run (a training, an evaluation) wrote them.
    A file that was there before the block is never the run's, whatever its name."""
    before = _claimable(train_dir) if os.path.isdir(train_dir) else set()
    started = int(time.time())
    try:
        yield
    finally:
        new = _claimable(train_dir) - before if os.path.isdir(train_dir) else set()
        new = {name for name in new if _written_by_this_life(name, started)}
        if new:
            _write_json(train_dir, RUN_FILES, sorted(written_files(train_dir) | new))


def _written_by_this_life(name: str, started: int) -> bool:
    """An event file names the second it was opened and the host that opened it
    (events.out.tfevents.<seconds>.<host>...): one opened by another host, or before
    this life started, is a file copied in, never ours. Traces carry no such names."""
    found = _EVENT_FIELDS.match(os.path.basename(name))
    if found is None:
        return True
    seconds, rest = int(found.group(1)), found.group(2)
    host = socket.gethostname()
    return seconds >= started - 1 and (rest == host or rest.startswith(host + "."))


def _run_paths(train_dir: str) -> List[str]:
    """The paths in train_dir that a run of ours wrote: its checkpoints, state, staging
    folder, the events and traces its lives recorded (`claiming`), that record, and the
    exports of export.py (a folder <step>/ that holds a SavedModel and nothing else);
    nothing of another origin."""
    from examples.cifar10 import export  # imports this module

    def ours(name):  # a checkpoint's data or .meta only beside its index
        prefix = re.sub(r"\.(meta|data-\d{5}-of-\d{5})$", "", name)
        return _RUN_FILE.match(name) and (
            prefix == name or os.path.exists(os.path.join(train_dir, prefix + ".index")))

    found = [n for n in os.listdir(train_dir) if ours(n)]
    if _staging_is_ours(train_dir):
        found.append(towerlib.run.checkpoints.SAVING_DIRNAME)
    recorded = written_files(train_dir)
    found += sorted(recorded & _claimable(train_dir))
    if os.path.isfile(os.path.join(train_dir, RUN_FILES)):
        found.append(RUN_FILES)
    exports = os.path.join(train_dir, "export")
    if _is_real_folder(exports):   # only the versions a run recorded, never a user's
        found += [os.path.join("export", n) for n in os.listdir(exports)
                  if n.isdigit() and os.path.join("export", n) in recorded
                  and _is_real_folder(os.path.join(exports, n))
                  and not export.foreign_files(os.path.join(exports, n))]
    return sorted(found)


def _refuse_foreign_folder(train_dir: str) -> None:
    """FlagError unless train_dir holds our run record (or an interrupted start-over's),
    or nothing but the generated data and towerlib's lock."""
    if any(os.path.isfile(os.path.join(train_dir, n)) for n in (CONFIG_FILE, STARTING_OVER)):
        return
    ours = (data_source.GENERATED_SUBDIR, folder_lock.LOCK_FILENAME)
    others = sorted(n for n in os.listdir(train_dir) if n not in ours)
    if others:
        raise options.FlagError(
            "--overwrite_train_dir: %r holds no %s, so no run of this script wrote it "
            "(it holds %s); nothing was deleted. Fix: another --train_dir, or move those "
            "files away yourself." % (train_dir, CONFIG_FILE, ", ".join(
                others[:4]) + (", ..." if len(others) > 4 else "")))


def start_over(train_dir: str) -> List[str]:
    """Deletes the run in train_dir: exactly what a run of ours wrote (`_run_paths`),
    keeping anything else (the generated data, a user's files); returns what went.
    Refuses a folder without our run record (FlagError) and one another trainer holds
    (RunError). The record is renamed first (so an interrupted start-over is never
    resumed, and is still known as ours) and removed last."""
    if not os.path.isdir(train_dir):
        return []
    _refuse_foreign_folder(train_dir)
    refuse_if_in_use(train_dir)
    record_path = os.path.join(train_dir, CONFIG_FILE)
    marker = os.path.join(train_dir, STARTING_OVER)
    if os.path.isfile(record_path):
        os.replace(record_path, marker)
    names = _run_paths(train_dir)   # every path checked, before anything is deleted
    for name in names:
        path = os.path.join(train_dir, name)
        if _is_real_folder(path):
            shutil.rmtree(path)
        else:
            os.remove(path)   # a link itself, never what it points at
    for folder in ("eval", "traces", "export"):
        path = os.path.join(train_dir, folder)
        if _is_real_folder(path) and not os.listdir(path):
            os.rmdir(path)
    if os.path.exists(marker):
        os.remove(marker)
        names.insert(0, CONFIG_FILE)
    if names:
        logger.info("--overwrite_train_dir: deleted the previous run in %s (%d files and "
                    "folders).", train_dir, len(names))
    return names


__all__ = ["CONFIG_FILE", "RUN_FILES", "check_checkpoint_fits_graph", "checkpoint_step",
           "claiming", "load", "record", "record_written", "resolve_flags", "restorable_checkpoint",
           "start_over", "towerlib", "written_files"]

"""Checking a training configuration in one pass, before anything is built.

A bad option found after the graph is built (or hours into training, at the
first checkpoint) costs a restart per mistake. `validate_config` checks every
option it is given, gathers every problem, and raises one `ConfigError`
listing them all, each with the fix. `run_training` calls it with its own
options; a training script calls it first with everything it knows (tower
count, batch sizes, devices, modes, paths), before building the graph.
"""

import dataclasses
import math
import numbers
import os
import uuid

import tensorflow as tf

from towerlib.step import devices as devices_lib
from towerlib.step.context import BN_MODES


@dataclasses.dataclass(frozen=True)
class ConfigProblem:
    """One bad option: which one, what is wrong, and how to fix it."""

    option: str
    problem: str
    fix: str

    def __str__(self):
        return f"{self.option}: {self.problem} Fix: {self.fix}"


class ConfigError(ValueError):
    """Every problem `validate_config` found, in one error.

    Attributes:
      problems: the ConfigProblems, in the order the options were checked.
    """

    def __init__(self, problems):
        self.problems = list(problems)
        count = len(self.problems)
        lines = [f"{count} problem{'s' if count > 1 else ''} in the training "
                 "configuration (nothing was built or run):"]
        lines += [f"  - {problem}" for problem in self.problems]
        super().__init__("\n".join(lines))


def _is_int(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value):
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


class _Checker:
    """Collects problems; each check method adds zero or more."""

    def __init__(self):
        self.problems = []

    def add(self, option, problem, fix):
        self.problems.append(ConfigProblem(option, problem, fix))

    def positive_int(self, option, value, fix, allow_none=True, minimum=1):
        if value is None:
            if not allow_none:
                self.add(option, "is required.", fix)
            return False
        if not _is_int(value) or value < minimum:
            self.add(option, f"must be an int >= {minimum}, got {value!r}.", fix)
            return False
        return True


def _check_towers(check, num_towers, devices, device_type, gpus, cpu_devices):
    """Returns the tower count when it is known and valid, else None."""
    if device_type is not None and str(device_type).lower() not in ("cpu", "gpu"):
        check.add("device_type", f"is {device_type!r}.",
                  "use 'gpu', 'cpu' or None (GPUs when there are any, else CPUs).")
        device_type = None
    if device_type is not None and str(device_type).lower() == "gpu" and gpus == 0:
        check.add("device_type", "is 'gpu' but TensorFlow sees no GPU on this machine.",
                  "use device_type='cpu' (virtual CPU devices) or check the CUDA "
                  "installation (tf.config.list_physical_devices('GPU')).")
    count_ok = check.positive_int(
        "num_towers", num_towers,
        "pass the number of GPUs (or virtual CPU devices) to replicate the model on.")
    towers = num_towers if count_ok else None
    if devices is None:
        wants_gpu = (str(device_type).lower() == "gpu" if device_type is not None
                     else gpus > 0)
        if towers is not None and wants_gpu and towers > gpus:
            check.add("num_towers", f"is {towers} but this machine has {gpus} GPU(s).",
                      f"use num_towers <= {gpus}, or device_type='cpu'.")
        return towers
    if isinstance(devices, str) or not hasattr(devices, "__iter__"):
        check.add("devices", f"must be a list of device strings, got {devices!r}.",
                  "pass e.g. ['/device:GPU:0', '/device:GPU:1'].")
        return towers
    devices = list(devices)
    if not devices:
        check.add("devices", "is empty.", "give at least one device, or pass num_towers.")
        return towers
    seen = set()
    for device in devices:
        try:
            spec = tf.DeviceSpec.from_string(str(device))
        except (ValueError, TypeError) as error:
            check.add("devices", f"{device!r} is not a device string ({error}).",
                      "write devices as '/device:GPU:0' or '/device:CPU:1'.")
            continue
        kind = (spec.device_type or "").upper()
        index = spec.device_index or 0
        if kind not in ("CPU", "GPU"):
            check.add("devices", f"{device!r} has device type {kind or 'none'}.",
                      "towers run on '/device:GPU:i' or '/device:CPU:i'.")
        elif kind == "GPU" and not spec.job and index >= gpus:
            check.add("devices", f"{device!r} does not exist: this machine has {gpus} "
                      "GPU(s).", f"use GPU indices 0..{max(gpus - 1, 0)}, or CPU devices.")
        elif kind == "CPU" and not spec.job and cpu_devices is not None and index >= cpu_devices:
            check.add("devices", f"{device!r} needs {index + 1} CPU devices but the "
                      f"session config asks for {cpu_devices}.",
                      f"build the config with towerlib.session_config({index + 1}) or "
                      "use CPU indices below the tower count.")
        key = (spec.job, spec.replica, spec.task, kind, index)
        if key in seen:
            check.add("devices", f"{device!r} appears more than once.",
                      "give each tower its own device.")
        seen.add(key)
    if towers is not None and towers != len(devices):
        check.add("num_towers", f"is {towers} but {len(devices)} devices were given.",
                  "pass only one of num_towers and devices, or make them agree.")
    return len(devices)


def _check_batch(check, towers, global_batch_size, per_tower_batch_size,
                 examples_per_step):
    global_ok = check.positive_int(
        "global_batch_size", global_batch_size,
        "give the number of examples in one optimizer step (all towers together).")
    tower_ok = check.positive_int(
        "per_tower_batch_size", per_tower_batch_size,
        "give the number of examples each tower gets per step.")
    if global_ok and towers is not None and global_batch_size < towers:
        check.add("global_batch_size",
                  f"is {global_batch_size}, fewer than the {towers} towers, so some "
                  "tower would get no examples.",
                  f"use a global batch of at least {towers} or fewer towers.")
    if global_ok and tower_ok and towers is not None \
            and per_tower_batch_size * towers != global_batch_size:
        check.add("per_tower_batch_size",
                  f"{per_tower_batch_size} x {towers} towers = "
                  f"{per_tower_batch_size * towers}, but global_batch_size is "
                  f"{global_batch_size}.",
                  "give only one of them (towerlib splits the global batch), or make "
                  "global_batch_size = per_tower_batch_size x num_towers.")
    if check.positive_int("examples_per_step", examples_per_step,
                          "give the global batch size (it only scales examples/sec)."):
        if global_ok and examples_per_step != global_batch_size:
            check.add("examples_per_step",
                      f"is {examples_per_step} but global_batch_size is "
                      f"{global_batch_size}.",
                      "pass the global batch size as examples_per_step.")


def _nearest_existing(path):
    path = os.path.abspath(path)
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def _check_train_dir(check, train_dir, probe_writes):
    if train_dir is None:
        return
    if not isinstance(train_dir, (str, os.PathLike)) or not str(train_dir):
        check.add("train_dir", f"must be a non-empty path, got {train_dir!r}.",
                  "give a directory for checkpoints and summaries.")
        return
    train_dir = os.fspath(train_dir)
    if "://" in train_dir:
        return  # remote file system: writability shows at the first save
    if os.path.exists(train_dir) and not os.path.isdir(train_dir):
        check.add("train_dir", f"{train_dir} exists and is not a directory.",
                  "pass a directory path, or move the file away.")
        return
    existing = _nearest_existing(train_dir)
    if not os.path.isdir(existing):
        check.add("train_dir", f"{train_dir} cannot be created: {existing} is a file.",
                  "choose a path whose parents are directories.")
        return
    if not probe_writes:
        return
    # Permission bits do not tell (root, read-only mounts, full disks): try.
    probe = os.path.join(existing, f".towerlib-write-test-{uuid.uuid4().hex}")
    try:
        if existing != os.path.abspath(train_dir):
            os.mkdir(probe)
            os.rmdir(probe)
        else:
            with open(probe, "w", encoding="utf-8") as handle:
                handle.write("ok")
            os.remove(probe)
    except OSError as error:
        what = ("is not writable" if existing == os.path.abspath(train_dir)
                else f"cannot be created: {existing} is not writable")
        check.add("train_dir", f"{train_dir} {what} ({error.strerror}).",
                  "choose a writable location, or fix its permissions or free space.")


def _check_training_loop(check, max_steps, save_checkpoint_steps, save_checkpoint_secs,
                         save_summaries_steps, log_every_n_steps, max_checkpoints_to_keep,
                         master, is_chief):
    if max_steps is not None and (not _is_int(max_steps) or max_steps < 0):
        check.add("max_steps", f"must be an int >= 0, got {max_steps!r}.",
                  "give the global step to stop at (not a count of new steps).")
    if save_checkpoint_steps is not None and save_checkpoint_secs is not None:
        check.add("save_checkpoint_steps/save_checkpoint_secs",
                  f"both are set ({save_checkpoint_steps} steps, "
                  f"{save_checkpoint_secs} secs).",
                  "give only one of them.")
    check.positive_int("save_checkpoint_steps", save_checkpoint_steps,
                       "checkpoint every N >= 1 steps (a final one is always written).")
    if save_checkpoint_secs is not None and (
            not _is_number(save_checkpoint_secs) or not save_checkpoint_secs > 0
            or not math.isfinite(save_checkpoint_secs)):
        check.add("save_checkpoint_secs",
                  f"must be a positive number of seconds, got {save_checkpoint_secs!r}.",
                  "e.g. 600 for every ten minutes.")
    check.positive_int("save_summaries_steps", save_summaries_steps,
                       "write summaries every N >= 1 steps, or pass None for none.")
    check.positive_int("log_every_n_steps", log_every_n_steps,
                       "log every N >= 1 steps.")
    check.positive_int("max_checkpoints_to_keep", max_checkpoints_to_keep,
                       "keep at least the newest checkpoint (1), e.g. 5.")
    if not is_chief and not master:
        check.add("is_chief", "is False but master is empty (a local session).",
                  "a non-chief worker waits for a chief on a cluster: pass master="
                  "'grpc://...' of this worker, or is_chief=True for local training.")


_REQUIRED_FIXES = {
    "train_dir": "give a directory for checkpoints and summaries.",
    "max_steps": "give the global step to stop at.",
    "num_towers": "give the number of towers.",
    "global_batch_size": "give the number of examples per optimizer step.",
}


def validate_config(*, num_towers=None, devices=None, device_type=None,
                    global_batch_size=None, per_tower_batch_size=None,
                    bn_mode=None, param_device=None, ema_decay=None,
                    learning_rate=None, train_dir=None, max_steps=None,
                    save_checkpoint_steps=None, save_checkpoint_secs=None,
                    save_summaries_steps=None, log_every_n_steps=None,
                    examples_per_step=None, max_checkpoints_to_keep=None,
                    master="", is_chief=True, session_config=None,
                    probe_writes=True, required=()):
    """Checks every given option and raises one ConfigError listing all problems.

    Options left as None are not checked. Nothing is built or left behind:
    `train_dir` (or, when it does not exist yet, its nearest existing parent)
    is probed by creating and deleting a temporary file (directory), since
    permission bits do not tell, e.g. for root or on a read-only or full
    file system.

    Args:
      num_towers, devices, device_type: as for build_train_graph / tower_devices.
      global_batch_size: examples per optimizer step, all towers together.
      per_tower_batch_size: examples per tower, when the script has that
        option too (it must agree with the global batch).
      bn_mode, param_device, ema_decay, learning_rate: as for build_train_graph.
      train_dir, max_steps, save_checkpoint_steps, save_checkpoint_secs,
      save_summaries_steps, log_every_n_steps, examples_per_step,
      max_checkpoints_to_keep, master, is_chief: as for run_training.
      session_config: the ConfigProto the session will use, to check that
        '/device:CPU:i' towers exist in it.
      probe_writes: probe train_dir's writability (only the chief writes).
      required: names of options that must be given (not None), e.g.
        ('train_dir', 'max_steps') for run_training.

    Raises:
      ConfigError: with one ConfigProblem per problem.
    """
    check = _Checker()
    given = dict(num_towers=num_towers, devices=devices, global_batch_size=global_batch_size,
                 train_dir=train_dir, max_steps=max_steps, bn_mode=bn_mode)
    for option in required:
        if given.get(option, None) is None:
            check.add(option, "is required.", _REQUIRED_FIXES.get(option, "give it."))
    gpus = devices_lib.local_gpu_count()
    cpu_devices = None
    if session_config is not None:
        cpu_devices = session_config.device_count.get("CPU", 1)
    towers = _check_towers(check, num_towers, devices, device_type, gpus, cpu_devices)
    if devices is None and towers is not None and cpu_devices is not None \
            and gpus == 0 and towers > cpu_devices:
        check.add("session_config", f"asks for {cpu_devices} CPU device(s) but there are "
                  f"{towers} CPU towers.",
                  f"use towerlib.session_config({towers}).")
    _check_batch(check, towers, global_batch_size, per_tower_batch_size, examples_per_step)
    if bn_mode is not None and bn_mode not in BN_MODES:
        check.add("bn_mode", f"is {bn_mode!r}.",
                  f"pick one of {', '.join(BN_MODES)} (see towerlib.batch_norm).")
    if param_device is not None and not callable(param_device) \
            and param_device not in devices_lib.PARAM_DEVICES:
        check.add("param_device", f"is {param_device!r}.",
                  "use 'cpu' (variables on the host CPU), 'gpu' (spread over the tower "
                  "GPUs) or a device function.")
    if ema_decay is not None and not (_is_number(ema_decay) and 0.0 < ema_decay < 1.0):
        check.add("ema_decay", f"must be in (0, 1), got {ema_decay!r}.",
                  "use e.g. 0.999, or None for no moving average.")
    if learning_rate is not None and _is_number(learning_rate) and not (
            learning_rate > 0 and math.isfinite(learning_rate)):
        check.add("learning_rate", f"must be a positive finite number, got "
                  f"{learning_rate!r}.", "use e.g. 0.1 (scaled for the global batch).")
    _check_train_dir(check, train_dir, probe_writes and is_chief)
    _check_training_loop(check, max_steps, save_checkpoint_steps, save_checkpoint_secs,
                         save_summaries_steps, log_every_n_steps, max_checkpoints_to_keep,
                         master, is_chief)
    if check.problems:
        raise ConfigError(check.problems)

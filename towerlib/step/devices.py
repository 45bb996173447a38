"""Which devices the towers run on, and where the shared variables live.

Towers go on GPUs when the machine has them, else on virtual CPU devices
(`session_config` asks the Session for N of them), so that multi-tower code is
testable on a laptop. Device strings are always full '/device:TYPE:i' specs;
nothing here assumes CPU. The rules of the tower count, devices and device type
are written once, in `tower_problems`: the build raises the first problem,
towerlib.validate_config lists them all.
"""

import logging
import numbers
from typing import NamedTuple

import tensorflow as tf

from towerlib.update.parameter_server import PARAM_DEVICES

# Ops that own variable storage; everything else follows the tower.
VARIABLE_OP_TYPES = frozenset(
    ["Variable", "VariableV2", "VarHandleOp", "AutoReloadVariable",
     "MutableHashTable", "MutableHashTableV2", "MutableHashTableOfTensors",
     "MutableHashTableOfTensorsV2", "MutableDenseHashTable",
     "MutableDenseHashTableV2"])



def local_gpu_count():
    """Number of GPUs TensorFlow can see in this process."""
    return len(tf.config.list_physical_devices("GPU"))


def warn_missing_gpus(devices):
    """Logs a warning for each GPU tower device this process does not have.

    A Session with soft placement (towerlib.session_config's default) would
    run such a tower on the CPU without a word. Devices of another job or
    task are not judged: they live in another process.
    """
    gpus = None
    for index, device in enumerate(devices):
        spec = tf.DeviceSpec.from_string(device)
        if spec.device_type != "GPU" or spec.job is not None:
            continue
        gpus = local_gpu_count() if gpus is None else gpus
        if (spec.device_index or 0) >= gpus:
            logging.getLogger("towerlib").warning(
                "Tower %d's device %s does not exist: this process has %d GPU(s), so a "
                "session with soft placement runs the tower on the CPU. Check "
                "CUDA_VISIBLE_DEVICES, or use towerlib.tower_devices().", index, device, gpus)


class TowerProblem(NamedTuple):
    """One problem of a tower configuration: the option, what is wrong, the fix.

    `what` is a sentence naming the option. `error` is what the build raises
    for it: TypeError for a value of the wrong type, else ValueError.
    """

    option: str
    what: str
    fix: str
    error: type = ValueError


def raise_first(problems):
    """Raises the first TowerProblem as its error ('what Fix: fix'), if there is one."""
    if problems:
        first = problems[0]
        raise first.error(f"{first.what} Fix: {first.fix}")


_COUNT_FIX = ("pass the number of GPUs (or virtual CPU devices) to replicate the tower "
              "function on.")


def _count_problems(num_towers):
    if isinstance(num_towers, bool) or not isinstance(num_towers, numbers.Integral):
        return [TowerProblem(
            "num_towers", f"num_towers must be a positive int, got {num_towers!r} "
            f"({type(num_towers).__name__}).", _COUNT_FIX, TypeError)]
    if num_towers < 1:
        return [TowerProblem("num_towers", f"num_towers must be at least 1, got {num_towers}.",
                             _COUNT_FIX)]
    return []


def check_num_towers(num_towers):
    raise_first(_count_problems(num_towers))


def _named_type(device_type):
    """'CPU' or 'GPU' when `device_type` names one (in any case), else None."""
    if isinstance(device_type, str) and device_type.upper() in ("CPU", "GPU"):
        return device_type.upper()
    return None


def tower_problems(num_towers=None, devices=None, device_type=None, *, gpus=None,
                   cpu_devices=None, judge_devices=False):
    """Every problem of a tower configuration, in order, and the tower count.

    Args:
      num_towers, devices, device_type: as for build_train_graph.
      gpus: the GPUs this process sees (counted when None and needed).
      cpu_devices: the CPU devices the session config asks for, if known.
      judge_devices: also judge explicit `devices` against this process: type
        CPU or GPU, the GPU exists, the CPU is in the session config
        (validate_config; the build only warns of a missing GPU, warn_missing_gpus).

    Returns:
      (problems, count): TowerProblems; len(devices), else a valid num_towers, else None.
    """
    problems = []
    named = _named_type(device_type)
    if device_type is not None and named is None:
        problems.append(TowerProblem(
            "device_type", f"Unknown device_type {device_type!r}.",
            "use 'gpu', 'cpu' or None (GPUs when there are any, else CPUs)."))
    count = None
    if num_towers is not None:
        count_problems = _count_problems(num_towers)
        problems += count_problems
        count = None if count_problems else num_towers
    if devices is None or judge_devices:
        gpus = local_gpu_count() if gpus is None else gpus
        if gpus == 0 and named == "GPU":
            problems.append(TowerProblem(
                "device_type", "device_type is 'gpu' but TensorFlow sees no GPU on this "
                "machine.", "use device_type='cpu' (virtual CPU devices), or check the CUDA "
                "installation (tf.config.list_physical_devices('GPU'))."))
    if devices is None:
        kind = named or ("GPU" if gpus else "CPU")
        return problems + _count_against_machine(count, kind, gpus, cpu_devices), count
    if isinstance(devices, str) or not hasattr(devices, "__iter__"):
        return problems + [TowerProblem(
            "devices", f"devices must be a list of device strings, got {devices!r}.",
            "e.g. devices=['/device:GPU:0', '/device:GPU:1'].", TypeError)], count
    devices = list(devices)
    if not devices:
        return problems + [TowerProblem(
            "devices", "devices is empty.",
            "give at least one device string, or leave devices None and pass num_towers.")], count
    seen = {}
    for index in range(len(devices)):
        problems += _device_problems(devices, index, seen, gpus if judge_devices else None,
                                     cpu_devices)
    problems += _type_disagreements(devices, named)
    if count is not None and count != len(devices):
        problems.append(TowerProblem(
            "num_towers", f"num_towers={count} but {len(devices)} devices were given "
            f"({devices}).", "pass only one of num_towers and devices, or make them agree."))
    return problems, len(devices)


def _type_disagreements(devices, named):
    """device_type next to explicit devices of another type: it would be ignored."""
    for index, device in enumerate(devices):
        try:
            kind = (tf.DeviceSpec.from_string(device).device_type or "").upper()
        except (ValueError, TypeError, AttributeError):
            continue  # named by _device_problems
        if named is not None and kind in ("CPU", "GPU") and kind != named:
            return [TowerProblem(
                "device_type", f"device_type is {named.lower()!r} but devices[{index}] = "
                f"{device!r} is a {kind}: device_type only chooses devices when none are "
                "given.", "drop device_type, or give devices of that type.")]
    return []


def _count_against_machine(count, kind, gpus, cpu_devices):
    """More towers than the machine's GPUs, or than the session config's CPUs."""
    if count is None:
        return []
    if kind == "GPU" and 0 < gpus < count:
        return [TowerProblem(
            "num_towers", f"num_towers is {count} but this machine has {gpus} GPU(s).",
            f"use num_towers <= {gpus}, or device_type='cpu' for virtual CPU devices.")]
    if kind == "CPU" and cpu_devices is not None and cpu_devices < count:
        return [TowerProblem(
            "session_config", f"session_config asks for {cpu_devices} CPU device(s) but "
            f"there are {count} CPU towers.", f"use towerlib.session_config({count}).")]
    return []


def _device_problems(devices, index, seen, gpus, cpu_devices):
    """devices[index]'s problems; with `gpus` None it is not judged against this process."""
    device = devices[index]
    name = f"devices[{index}] = {device!r}"
    fix = "write devices as '/device:GPU:0' or '/device:CPU:1'."
    if not isinstance(device, str):
        return [TowerProblem("devices", f"{name} is not a device string.", fix)]
    try:
        spec = tf.DeviceSpec.from_string(device)
    except (ValueError, TypeError) as error:
        return [TowerProblem("devices", f"{name} is not a device string ({error}).", fix)]
    kind, number = (spec.device_type or "").upper(), spec.device_index or 0
    problems = [] if gpus is None else _missing_device(name, spec, kind, number, gpus,
                                                       cpu_devices)
    key = (spec.job, spec.replica, spec.task, kind, number)
    if key in seen:
        problems.append(TowerProblem(
            "devices", f"{name} is the same device as devices[{seen[key]}] "
            f"({devices[seen[key]]!r}).", "give each tower its own device."))
    seen.setdefault(key, index)
    return problems


def _missing_device(name, spec, kind, number, gpus, cpu_devices):
    """A device that is not a CPU or GPU, or one this process (session config) lacks."""
    if kind not in ("CPU", "GPU"):
        return [TowerProblem("devices", f"{name} has device type {kind or 'none'}.",
                             "towers run on '/device:GPU:i' or '/device:CPU:i'.")]
    if spec.job:
        return []  # another process's device
    if kind == "GPU" and number >= gpus:
        return [TowerProblem(
            "devices", f"{name} does not exist: this machine has {gpus} GPU(s).",
            f"use GPU indices 0..{max(gpus - 1, 0)}, or CPU devices.")]
    if kind == "CPU" and cpu_devices is not None and number >= cpu_devices:
        return [TowerProblem(
            "devices", f"{name} needs {number + 1} CPU devices but the session config asks "
            f"for {cpu_devices}.", f"build the config with towerlib.session_config("
            f"{number + 1}) or use CPU indices below the tower count.")]
    return []


def resolve_devices(num_towers=None, devices=None, device_type=None):
    """The tower device list from a count, an explicit list, or the machine."""
    if devices is None:
        return tower_devices(num_towers, device_type)
    raise_first(tower_problems(num_towers, devices, device_type)[0])
    return list(devices)


def tower_devices(num_towers=None, device_type=None):
    """Device strings for `num_towers` towers.

    Args:
      num_towers: how many towers; None means one per local GPU (at least 1).
      device_type: 'gpu', 'cpu' or None (GPUs when present, else CPUs).

    Returns:
      ['/device:GPU:0', ...] or ['/device:CPU:0', ...]; CPU devices beyond
      the first exist only in a Session configured by `session_config`.
    """
    gpus = local_gpu_count()
    raise_first(tower_problems(num_towers, None, device_type, gpus=gpus)[0])
    kind = _named_type(device_type) or ("GPU" if gpus else "CPU")
    if num_towers is None:
        num_towers = max(gpus, 1) if kind == "GPU" else 1
    return [f"/device:{kind}:{i}" for i in range(num_towers)]


def session_config(num_towers=1, allow_soft_placement=True,
                   log_device_placement=False, base_config=None):
    """A ConfigProto under which `num_towers` towers have devices to run on.

    Asks for `num_towers` CPU devices (virtual ones share the real cores) so
    that '/device:CPU:i' towers exist; GPUs, when present, are left as found,
    with memory growth on so towers do not grab all memory at once.
    """
    check_num_towers(num_towers)
    config = tf.compat.v1.ConfigProto()
    if base_config is not None:
        config.CopyFrom(base_config)
    config.allow_soft_placement = allow_soft_placement
    config.log_device_placement = log_device_placement
    config.device_count["CPU"] = max(num_towers, config.device_count.get("CPU", 1))
    config.gpu_options.allow_growth = True
    return config


def _variable_bytes(op):
    """Bytes of the variable an op creates, from its shape and dtype attrs."""
    try:
        shape = tf.TensorShape(op.get_attr("shape"))
        dtype = tf.as_dtype(op.get_attr("dtype"))
    except (ValueError, TypeError):
        return 0
    if not shape.is_fully_defined():
        return 0
    return shape.num_elements() * dtype.size


class GreedyVariablePlacer:
    """Spreads variables over devices, each new one to the least-loaded device.

    Balancing by byte size (not by count) keeps one large dense layer from
    piling onto the same device as all the others.
    """

    def __init__(self, devices):
        if not devices:
            raise ValueError("GreedyVariablePlacer needs at least one device.")
        self.devices = list(devices)
        self.bytes_per_device = [0] * len(self.devices)

    def __call__(self, op):
        least = min(range(len(self.devices)), key=self.bytes_per_device.__getitem__)
        self.bytes_per_device[least] += _variable_bytes(op)
        return self.devices[least]


def variable_placer(param_device, devices):
    """A function op -> device string for variable ops.

    Args:
      param_device: 'cpu' (all variables on /device:CPU:0 of the towers' host),
        'gpu' (spread over the tower devices by byte size), a device function
        of your own (e.g. tf.compat.v1.train.replica_device_setter's), or None:
        each tower's variables on the tower's own device (replicated copies).
      devices: the tower devices.

    Returns:
      The device function, or None for "the tower's own device".
    """
    if param_device is None:
        return None
    if callable(param_device):
        return param_device
    if isinstance(param_device, str):
        param_device = param_device.lower()
    if param_device not in PARAM_DEVICES:
        raise ValueError(
            f"Unknown param_device {param_device!r}. Use 'cpu' (variables on the "
            "host CPU), 'gpu' (spread over the tower GPUs by size) or a device "
            "function.")
    if param_device == "cpu":
        host = tf.DeviceSpec.from_string(devices[0])
        cpu = host.replace(device_type="CPU", device_index=0).to_string()
        return lambda op: cpu
    return GreedyVariablePlacer(devices)


def tower_device_function(tower_device, placer):
    """The device function for one tower's ops.

    Variable ops go where `placer` says (the tower's device when it is
    None). Every other op goes to the tower's
    device, except for the parts of a device the op already asked for
    itself: an inner `tf.device` in the tower function wins, as nested
    device scopes do in TensorFlow.
    """
    tower_spec = tf.DeviceSpec.from_string(tower_device)

    def choose(op):
        if op.type in VARIABLE_OP_TYPES and placer is not None:
            return placer(op)
        requested = tf.DeviceSpec.from_string(op.device or "")
        return tower_spec.make_merged_spec(requested).to_string()

    return choose


def host_cpu(device):
    """The CPU of the machine (job/task) that `device` belongs to.

    '/job:worker/task:1/device:GPU:3' -> '/job:worker/task:1/device:CPU:0':
    input pipelines, the global step and host-side reductions go there.
    """
    spec = tf.DeviceSpec.from_string(device)
    return spec.replace(device_type="CPU", device_index=0).to_string()


def missing_tower_devices(session, tower_devices):
    """[(tower index, device)] for each tower device `session` does not have.

    Soft placement would otherwise run such a tower somewhere else without a
    word: '/device:CPU:5' on a session of 2 CPUs, or a GPU tower on a
    machine without GPUs. Job and task are compared when the tower names them.
    """
    available = [tf.DeviceSpec.from_string(d.name) for d in session.list_devices()]

    def present(spec):
        return any(
            a.device_type == spec.device_type
            and spec.device_index in (None, a.device_index)
            and spec.job in (None, a.job) and spec.task in (None, a.task)
            for a in available)

    return [(index, device) for index, device in enumerate(tower_devices)
            if not present(tf.DeviceSpec.from_string(device))]

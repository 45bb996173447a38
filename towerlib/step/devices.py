"""Which devices the towers run on, and where the shared variables live.

Towers go on GPUs when the machine has them, else on virtual CPU devices
(`session_config` asks the Session for N of them), so that multi-tower code is
testable on a laptop. Device strings are always full '/device:TYPE:i' specs;
nothing here assumes CPU.
"""

import numbers
import logging

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


def check_num_towers(num_towers):
    if isinstance(num_towers, bool) or not isinstance(num_towers, numbers.Integral):
        raise TypeError(
            f"num_towers must be a positive int, got {num_towers!r} "
            f"({type(num_towers).__name__}).")
    if num_towers < 1:
        raise ValueError(
            f"num_towers must be at least 1, got {num_towers}. Pass the number "
            "of GPUs (or virtual CPU devices) to replicate the tower function on.")


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
    if device_type is None:
        device_type = "gpu" if gpus else "cpu"
    device_type = device_type.lower()
    if device_type not in ("cpu", "gpu"):
        raise ValueError(
            f"Unknown device_type {device_type!r}: use 'gpu', 'cpu' or None.")
    if num_towers is None:
        num_towers = max(gpus, 1) if device_type == "gpu" else 1
    check_num_towers(num_towers)
    if device_type == "gpu" and num_towers > gpus:
        fix = (f"use num_towers <= {gpus}, or device_type='cpu' for virtual CPU "
               "devices" if gpus else "use device_type='cpu' for virtual CPU devices, "
               "or check the CUDA installation (tf.config.list_physical_devices('GPU'))")
        raise ValueError(f"Asked for {num_towers} GPU towers but this machine has {gpus} "
                         f"GPU(s). Fix: {fix}.")
    return [f"/device:{device_type.upper()}:{i}" for i in range(num_towers)]


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

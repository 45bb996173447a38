"""Bytes each device sends and receives per training step, counted from the graph.

    python -m bench.traffic --towers=2,4,8 --models=resnet20,resnet50_sized \
        --bandwidths_gbps=12,150 --global_batch=128

No GPU is needed: the training graph is built with GPU device strings
('/device:GPU:0', ...) and never run. For each model and tower count it builds
the three ways towerlib can update the variables,

  ps/cpu      update=towerlib.ParameterServer(device='cpu')
  ps/gpu      update=towerlib.ParameterServer(device='gpu')
  replicated  update='replicated', exchange='collective' (NCCL)

counts what crosses between devices in one step (`count_traffic`, below) and
prints a markdown table: the busiest device's bytes sent and received, the
bytes moved in all, and the step-time floor that traffic implies on links of
the given bandwidths.

How the bytes are counted (`count_traffic`):

  1. The step: the ops the train op needs, walking back from it through data
     and control inputs. Initializers, savers and summaries are not in it.
  2. Where each op runs, as TensorFlow's placer decides it for these graphs:
     the device the op asked for; ops colocated (the `_class` attribute) and
     ops taking a variable's resource handle go where the variable (or the
     colocation target) is; an op that asked for no device goes to the first
     GPU (the first CPU when there is no GPU), the placer's default.
  3. Graph edges: a data input whose producer runs on another device than its
     consumer carries the tensor's bytes (static shape x dtype size) once per
     step. TensorFlow makes one Send/Recv pair per (tensor, destination
     device), however many ops there read the tensor, so transfers are
     deduplicated on that pair. Control edges carry no data and are not
     counted.
  4. Collective ops are not edges. An all-reduce of S bytes among T devices
     is counted as the ring algorithm NCCL uses for large buffers moves it:
     each device sends and receives 2 (T - 1) / T x S (reduce-scatter, then
     all-gather, each T - 1 steps of S / T). An all-gather in which every
     device contributes S bytes (and ends with T x S): each device sends and
     receives (T - 1) x S.

The floor. With one full-duplex link of bandwidth W per device (GPU or host
CPU) into a non-blocking fabric, and no overlap of communication with compute
or with each other's hops, a step cannot take less than

    max over devices of max(sent, received) / W.

This is a lower bound on the communication time, not a prediction of the
step time: latency, PCIe topology (GPUs behind one switch share its uplink)
and NCCL's protocol overheads only add to it, and overlap with the backward
pass only hides it.
"""

import collections
import dataclasses
import os
import sys
from typing import Dict, Iterable, List, Optional, Tuple

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tensorflow as tf  # noqa: E402

import towerlib  # noqa: E402
from examples.cifar10.models import CifarModel, make_model  # noqa: E402
from towerlib import layers  # noqa: E402

# Ops that own a variable's storage: everything taking its handle runs there.
VARIABLE_OP_TYPES = frozenset(
    ["VarHandleOp", "VariableV2", "Variable", "AutoReloadVariable", "_VarHandlesOp"])
# Ops that read a variable's value (their output is the variable's bytes).
VARIABLE_READ_OP_TYPES = frozenset(["ReadVariableOp", "ResourceGather"])
ALL_REDUCE_OP_TYPES = frozenset(
    ["CollectiveReduce", "CollectiveReduceV2", "CollectiveReduceV3", "NcclAllReduce"])
ALL_GATHER_OP_TYPES = frozenset(["CollectiveGather", "CollectiveGatherV2"])


# ----------------------------------------------------------------- counting


def ring_all_reduce_bytes(payload_bytes: float, group_size: int) -> float:
    """Bytes each of `group_size` devices sends (and receives) in a ring all-reduce.

    2 (T - 1) / T x S: a reduce-scatter and an all-gather, each T - 1 steps
    in which every device passes one S / T chunk to its neighbour. E.g. 100 MB
    over 8 GPUs: 175 MB sent and 175 MB received by each.
    """
    return 2.0 * (group_size - 1) * payload_bytes / group_size


def ring_all_gather_bytes(payload_bytes: float, group_size: int) -> float:
    """Bytes each device sends (and receives) in a ring all-gather of S bytes each.

    (T - 1) x S: T - 1 steps, in each of which every device passes on one
    device's S-byte block; every device ends holding T x S.
    """
    return float((group_size - 1) * payload_bytes)


@dataclasses.dataclass(frozen=True)
class EdgeTransfer:
    """One tensor sent from one device to another, once per step.

    kind: 'variable' (a read of a variable's value), 'input' (computed from no
    variable: the input batch, constants) or 'computed' (anything else:
    gradients, activations, batch statistics).
    """

    tensor: str
    source: str
    destination: str
    num_bytes: int
    kind: str


@dataclasses.dataclass(frozen=True)
class CollectiveTransfer:
    """One device's part in one collective op, by the ring model."""

    op: str
    device: str
    kind: str  # 'all-reduce' or 'all-gather'
    group_size: int
    payload_bytes: int  # S: this device's input tensor
    sent_bytes: float
    received_bytes: float


@dataclasses.dataclass
class Traffic:
    """What one step moves between devices.

    Attributes:
      edges: the deduplicated cross-device graph edges.
      collectives: each collective op's share, per device.
      unsized: tensors crossing devices whose size the graph does not say
        (counted as 0 bytes; empty for fully static graphs).
      devices: where each op of the step runs, {op name: device}.
    """

    edges: List[EdgeTransfer]
    collectives: List[CollectiveTransfer]
    unsized: List[str]
    devices: Dict[str, str]

    def per_device(self, kinds: Optional[Iterable[str]] = None) -> Dict[str, Tuple[float, float]]:
        """{device: (sent bytes, received bytes)}; `kinds` limits the edges counted."""
        kinds = None if kinds is None else set(kinds)
        sent = collections.defaultdict(float)
        received = collections.defaultdict(float)
        for device in set(self.devices.values()):
            sent[device], received[device] = 0.0, 0.0
        for edge in self.edges:
            if kinds is None or edge.kind in kinds:
                sent[edge.source] += edge.num_bytes
                received[edge.destination] += edge.num_bytes
        for part in self.collectives:
            if kinds is None or "collective" in kinds:
                sent[part.device] += part.sent_bytes
                received[part.device] += part.received_bytes
        return {device: (sent[device], received[device]) for device in sorted(sent)}


def step_ops(fetches) -> List[tf.Operation]:
    """The ops running a step of `fetches` needs: data and control ancestors.

    Args:
      fetches: an op, a tensor, or a list of them (e.g. the train op).
    """
    fetches = fetches if isinstance(fetches, (list, tuple)) else [fetches]
    start = [f if isinstance(f, tf.Operation) else f.op for f in fetches]
    seen = {op.name: op for op in start}
    stack = list(start)
    while stack:
        op = stack.pop()
        for parent in [t.op for t in op.inputs] + list(op.control_inputs):
            if parent.name not in seen:
                seen[parent.name] = parent
                stack.append(parent)
    return sorted(seen.values(), key=lambda op: op._id)  # creation order


def _canonical(device: str) -> str:
    return tf.DeviceSpec.from_string(device).to_string() if device else ""


def _default_device(ops) -> str:
    """The placer's choice for an op that asked for nothing: GPU:0, else CPU:0."""
    specs = [tf.DeviceSpec.from_string(op.device) for op in ops if op.device]
    gpus = [s for s in specs if s.device_type == "GPU"]
    if gpus:
        return min(gpus, key=lambda s: s.device_index or 0).to_string()
    cpus = [s for s in specs if s.device_type == "CPU"]
    if cpus:
        return cpus[0].replace(device_index=0).to_string()
    return "/device:CPU:0"


def place(ops: List[tf.Operation], default_device: Optional[str] = None) -> Dict[str, str]:
    """{op name: device} for `ops`, following the placer's colocation rules.

    Colocation groups are the union of each op's `_class` ('loc:@name')
    targets and of every op consuming a resource (or ref) tensor with that
    tensor's producer: TensorFlow runs an op that takes a variable's handle on
    the variable's device, whatever device the op asked for. A group runs on
    its variable's device when it holds one, else on the first device a member
    asked for (in creation order), else on `default_device`.
    """
    graph = ops[0].graph
    parent: Dict[str, str] = {}

    def find(name):
        parent.setdefault(name, name)
        while parent[name] != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    def union(a, b):
        parent[find(a)] = find(b)

    members = {op.name: op for op in ops}
    for op in ops:
        find(op.name)
        for group in op.colocation_groups():
            target = group.decode()[len("loc:@"):]
            if target != op.name:
                members.setdefault(target, graph.get_operation_by_name(target))
                union(op.name, target)
        for tensor in op.inputs:
            if tensor.dtype.base_dtype == tf.resource or tensor.dtype._is_ref_dtype:
                union(op.name, tensor.op.name)

    chosen: Dict[str, str] = {}
    ordered = sorted(members.values(), key=lambda op: op._id)
    for op in ordered:  # variables decide first
        if op.type in VARIABLE_OP_TYPES and op.device:
            chosen.setdefault(find(op.name), _canonical(op.device))
    for op in ordered:
        if op.device:
            chosen.setdefault(find(op.name), _canonical(op.device))
    default_device = _canonical(default_device) if default_device else _default_device(ops)
    return {op.name: chosen.get(find(op.name), default_device) for op in ops}


def _tensor_bytes(tensor) -> Optional[int]:
    if tensor.dtype.base_dtype in (tf.resource, tf.variant, tf.string):
        return None
    elements = tensor.shape.num_elements()
    return None if elements is None else elements * tensor.dtype.base_dtype.size


def _group_size(op) -> int:
    for attribute in ("group_size", "num_devices"):
        if attribute in op.node_def.attr:
            return int(op.get_attr(attribute))
    size = tf.get_static_value(op.inputs[1])  # the V2 ops take it as an input
    if size is None:
        raise ValueError(f"The group size of collective {op.name} is not static.")
    return int(size)


def _variable_free(ops) -> Dict[str, bool]:
    """{op name: True when the op computes from no variable} for the step's ops."""
    free: Dict[str, bool] = {}
    for root in ops:
        stack = [(root, False)]
        while stack:
            op, inputs_done = stack.pop()
            if op.name in free:
                continue
            parents = [t.op for t in op.inputs]
            if not inputs_done:
                stack.append((op, True))
                stack.extend((p, False) for p in parents if p.name not in free)
                continue
            free[op.name] = op.type not in VARIABLE_OP_TYPES and all(
                free[p.name] for p in parents)
    return free


def _is_variable_read(tensor) -> bool:
    op = tensor.op
    while op.type == "Identity" and op.inputs and op.inputs[0].dtype != tf.resource:
        op = op.inputs[0].op
    return op.type in VARIABLE_READ_OP_TYPES or op.type in VARIABLE_OP_TYPES


def count_traffic(fetches, default_device: Optional[str] = None) -> Traffic:
    """What one step of `fetches` moves between devices (see the module docstring).

    Args:
      fetches: the train op (or ops/tensors fetched together in one step).
      default_device: where ops that asked for no device run; None: the
        placer's default, the first GPU of the graph (else CPU:0).
    """
    ops = step_ops(fetches)
    devices = place(ops, default_device)
    free = _variable_free(ops)
    edges, collectives, unsized, seen = [], [], [], set()
    for op in ops:
        destination = devices[op.name]
        if op.type in ALL_REDUCE_OP_TYPES or op.type in ALL_GATHER_OP_TYPES:
            payload = _tensor_bytes(op.inputs[0])
            if payload is None:
                unsized.append(op.inputs[0].name)
                payload = 0
            group_size = _group_size(op)
            if op.type in ALL_REDUCE_OP_TYPES:
                kind, moved = "all-reduce", ring_all_reduce_bytes(payload, group_size)
            else:
                kind, moved = "all-gather", ring_all_gather_bytes(payload, group_size)
            collectives.append(CollectiveTransfer(
                op.name, destination, kind, group_size, payload, moved, moved))
        for tensor in op.inputs:
            source = devices[tensor.op.name]
            if source == destination or (tensor.name, destination) in seen:
                continue
            seen.add((tensor.name, destination))
            num_bytes = _tensor_bytes(tensor)
            if num_bytes is None:
                unsized.append(tensor.name)
                num_bytes = 0
            if _is_variable_read(tensor):
                kind = "variable"
            elif free[tensor.op.name]:
                kind = "input"
            else:
                kind = "computed"
            edges.append(EdgeTransfer(tensor.name, source, destination, num_bytes, kind))
    return Traffic(edges, collectives, unsized, devices)


def device_traffic(train_op, default_device: Optional[str] = None
                   ) -> Dict[str, Tuple[float, float]]:
    """{device: (bytes sent, bytes received)} in one step of `train_op`.

    Worked example: 2 towers on '/device:GPU:0' and '/device:GPU:1', one
    dense layer 5 -> 3 (weights 15 floats = 60 bytes, biases 12 bytes),
    plain SGD, global batch 8 of x [8, 5] and y [8, 3] made on the host CPU,
    parameter server on the CPU. In a step the CPU sends each GPU the
    weights and biases (72 bytes) and its shard of the batch (x [4, 5] 80
    bytes, y [4, 3] 48 bytes), and receives a 72-byte gradient from each:

        CPU:0 sends 2 x (72 + 128) = 400, receives 2 x 72 = 144
        GPU:i sends 72, receives 200

    (plus a few 4-byte scalars: each tower's share of the batch and the
    learning rate, made on the default device GPU:0). Replicated through
    NCCL instead: no weight crosses; the two gradients, packed into one
    72-byte buffer, are all-reduced: 2 (2 - 1) / 2 x 72 = 72 bytes sent and
    received by each GPU, on top of the 128 input bytes each receives from
    the CPU. tests/bench/test_traffic.py checks exactly these numbers.
    """
    return count_traffic(train_op, default_device).per_device()


# ------------------------------------------------------------ the models


class ResNet50Sized(CifarModel):
    """ResNet-50's layers (He et al. 2016, table 1), on CIFAR's 32x32 images.

    7x7/2 conv 64, 3x3/2 max pool, bottleneck stages of 3, 4, 6, 3 blocks
    (1x1 w, 3x3 w, 1x1 4w with w = 64, 128, 256, 512; the stride and a
    1x1 projection with batch norm in each stage's first block; the
    stride on the 3x3 conv as in torchvision), global average pool, a
    dense layer to 1000 classes. No conv biases, towerlib batch norm:
    25,557,032 trainable float32 weights (102.2 MB), the count of
    torchvision's resnet50, plus 53,120 moving statistics. The spatial
    size changes no weight shape, so the 32x32 input keeps the build
    small: 32 -> 16 -> 8 -> 8, 4, 2, 1.
    """

    name = "resnet50_sized"
    default_weight_decay = 1e-4
    STAGES = ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2))
    CLASSES = 1000

    def _conv(self, x, filters, kernel_size, name, strides=1):
        return layers.conv2d(x, filters, kernel_size, name=name, strides=strides,
                             use_bias=False, weight_decay=self.weight_decay)

    def _bottleneck(self, x, ctx, width, strides, name):
        """[B, H, W, C] -> [B, H / strides, W / strides, 4 width]."""
        with tf.compat.v1.variable_scope(name):
            h = tf.nn.relu(self._batch_norm(self._conv(x, width, 1, "conv1"), ctx, "bn1"))
            h = tf.nn.relu(self._batch_norm(
                self._conv(h, width, 3, "conv2", strides), ctx, "bn2"))
            h = self._batch_norm(self._conv(h, 4 * width, 1, "conv3"), ctx, "bn3")
            if strides != 1 or int(x.shape[-1]) != 4 * width:
                x = self._batch_norm(self._conv(x, 4 * width, 1, "projection", strides),
                                     ctx, "projection_bn")
            return tf.nn.relu(h + x)

    def logits(self, images, ctx):
        h = self._conv(images, 64, 7, "conv_in", strides=2)
        h = tf.nn.relu(self._batch_norm(h, ctx, "bn_in"))
        h = layers.max_pool2d(h, 3, 2)
        for stage, (width, blocks, strides) in enumerate(self.STAGES):
            for block in range(blocks):
                h = self._bottleneck(h, ctx, width, strides if block == 0 else 1,
                                     f"stage{stage + 2}_block{block + 1}")
        h = layers.global_avg_pool2d(h)  # [B, 2048]
        return layers.dense(h, self.CLASSES, name="logits",
                            weight_decay=self.weight_decay)


def make_traffic_model(name: str):
    """'resnet50_sized' or a model of the CIFAR example ('resnet20', ...)."""
    if name == "resnet50_sized":
        return ResNet50Sized()
    return make_model(name)


# Each way of updating the variables: (label, build_train_graph options).
VARIABLE_UPDATES = (
    ("ps/cpu", dict(update=towerlib.ParameterServer(device="cpu"))),
    ("ps/gpu", dict(update=towerlib.ParameterServer(device="gpu"))),
    ("replicated", dict(update="replicated", exchange="collective")),
)


@dataclasses.dataclass
class TrafficRow:
    """One model, tower count and variable update, counted."""

    model: str
    towers: int
    update: str
    weight_bytes: int  # the trainable variables, once
    traffic: Traffic
    weights_by_device: Dict[str, int]  # bytes of tower 0's trainable variables per device

    @property
    def busiest(self) -> Tuple[str, float, float]:
        """(device, sent, received) of the device with the largest max(sent, received)."""
        per_device = self.traffic.per_device()
        device = max(per_device, key=lambda d: max(per_device[d]))
        return (device,) + per_device[device]

    @property
    def total_bytes(self) -> float:
        """Bytes moved in the step: the sum over devices of bytes sent."""
        return sum(sent for sent, _ in self.traffic.per_device().values())

    @property
    def input_bytes(self) -> float:
        """Bytes of the input batch (and constants) that cross devices."""
        return sum(sent for sent, _ in self.traffic.per_device(["input"]).values())

    def floor_seconds(self, bandwidth_bytes_per_second: float) -> float:
        _, sent, received = self.busiest
        return max(sent, received) / bandwidth_bytes_per_second


def build_and_count(model_name: str, num_towers: int, update: str, global_batch: int,
                    bn_mode: str = "first_tower") -> TrafficRow:
    """Builds one training graph on GPU device strings (never run) and counts it."""
    options = dict(VARIABLE_UPDATES)[update]
    model = make_traffic_model(model_name)
    graph = tf.Graph()
    with graph.as_default():
        with tf.device("/device:CPU:0"):  # the input pipeline's host
            images = tf.zeros([global_batch, 32, 32, 3], tf.float32, name="images")
            labels = tf.zeros([global_batch], tf.int32, name="labels")
        train = towerlib.build_train_graph(
            model, (images, labels), tf.compat.v1.train.MomentumOptimizer(0.1, 0.9),
            devices=[f"/device:GPU:{i}" for i in range(num_towers)], bn_mode=bn_mode,
            summaries=False, **options)
        counted = count_traffic(train.train_op)
        weights_by_device = collections.Counter()
        for variable in tf.compat.v1.trainable_variables():
            weights_by_device[counted.devices[variable.op.name]] += (
                variable.shape.num_elements() * variable.dtype.base_dtype.size)
        return TrafficRow(model_name, num_towers, update, sum(weights_by_device.values()),
                          counted, dict(weights_by_device))


# ------------------------------------------------------------- the report

MB = 1e6


def markdown_table(rows: List[TrafficRow], bandwidths_gbps: List[float]) -> str:
    """The report: one line per row, floors at each bandwidth, ratios to ps/cpu."""
    header = ["model", "towers", "variable update", "busiest device",
              "its MB sent / received per step", "MB moved per step (all devices)",
              "of which input batch (MB)"]
    header += [f"floor at {w:g} GB/s (ms)" for w in bandwidths_gbps]
    header += ["floor / ps/cpu floor"]
    lines = ["| " + " | ".join(header) + " |",
             "| " + " | ".join(["---"] * 3 + ["---"] + ["---:"] * (len(header) - 4)) + " |"]
    baseline = {(r.model, r.towers): r for r in rows if r.update == "ps/cpu"}
    for row in rows:
        device, sent, received = row.busiest
        cells = [row.model, str(row.towers), row.update, device.replace("/device:", ""),
                 f"{sent / MB:.1f} / {received / MB:.1f}", f"{row.total_bytes / MB:.1f}",
                 f"{row.input_bytes / MB:.2f}"]
        cells += [f"{row.floor_seconds(w * 1e9) * 1e3:.2f}" for w in bandwidths_gbps]
        base = baseline.get((row.model, row.towers))
        cells.append(f"{row.floor_seconds(1.0) / base.floor_seconds(1.0):.2f}x"
                     if base else "")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def breakdown_table(rows: List[TrafficRow]) -> str:
    """MB crossing devices per step by what it is, and the collectives' count.

    'largest on one device' is the bytes of the trainable variables on the
    device holding most (tower 0's copies for 'replicated'): with ps/gpu it
    sets the busiest GPU's traffic, S + (T - 2) x that.
    """
    lines = ["| model | towers | variable update | weights (MB) | largest on one device (MB) | "
             "variable reads (MB) | computed tensors (MB) | input (MB) | "
             "collectives: ops, MB all-reduced per device |",
             "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for row in rows:
        by_kind = collections.Counter()
        for edge in row.traffic.edges:
            by_kind[edge.kind] += edge.num_bytes
        parts = row.traffic.collectives
        devices = {p.device for p in parts}
        payload = sum(p.payload_bytes for p in parts) / max(len(devices), 1)
        lines.append(
            f"| {row.model} | {row.towers} | {row.update} | {row.weight_bytes / MB:.1f} | "
            f"{max(row.weights_by_device.values()) / MB:.1f} | "
            f"{by_kind['variable'] / MB:.1f} | {by_kind['computed'] / MB:.1f} | "
            f"{by_kind['input'] / MB:.2f} | "
            f"{len(parts) // max(len(devices), 1)}, {payload / MB:.1f} |")
    return "\n".join(lines)


def _define_flags():
    from absl import flags
    flags.DEFINE_list("towers", ["2", "4", "8"], "Tower counts.")
    flags.DEFINE_list("models", ["resnet20", "resnet50_sized"],
                      "resnet50_sized, or models of examples/cifar10/models.py.")
    flags.DEFINE_list("updates", [label for label, _ in VARIABLE_UPDATES],
                      "Variable updates to count: ps/cpu, ps/gpu, replicated.")
    flags.DEFINE_list("bandwidths_gbps", ["12", "150"],
                      "Link bandwidths in GB/s (defaults: PCIe 3.0 x16 ~12, NVLink 150).")
    flags.DEFINE_integer("global_batch", 128, "Examples per step over all towers "
                         "(only the input batch's bytes depend on it).")
    flags.DEFINE_string("bn_mode", "first_tower", "Batch-norm mode of the builds.")
    flags.DEFINE_bool("details", False, "Also list each row's cross-device edges by size.")
    return flags.FLAGS


def main(argv):
    del argv
    flags_values = FLAGS  # defined by _define_flags when run as a script
    bandwidths = [float(w) for w in flags_values.bandwidths_gbps]
    rows = []
    for model_name in flags_values.models:
        for num_towers in (int(t) for t in flags_values.towers):
            for update in flags_values.updates:
                row = build_and_count(model_name, num_towers, update,
                                      flags_values.global_batch, flags_values.bn_mode)
                rows.append(row)
                print(f"counted {model_name} x{num_towers} {update}: "
                      f"{len(row.traffic.edges)} cross-device edges, "
                      f"{len(row.traffic.collectives)} collective ops, "
                      f"unsized: {len(row.traffic.unsized)}", file=sys.stderr, flush=True)
                if flags_values.details:
                    for edge in sorted(row.traffic.edges, key=lambda e: -e.num_bytes)[:40]:
                        print(f"    {edge.num_bytes:>12,d} B {edge.kind:9s} {edge.source} -> "
                              f"{edge.destination}  {edge.tensor}", file=sys.stderr)
    print(f"Global batch {flags_values.global_batch} of 32x32x3 float32 images made on "
          f"the host CPU, Momentum, bn_mode={flags_values.bn_mode}; towers on GPU device "
          "strings, graphs built and never run.\n")
    print(markdown_table(rows, bandwidths))
    print()
    print(breakdown_table(rows))


if __name__ == "__main__":
    from absl import app
    FLAGS = _define_flags()
    app.run(main)

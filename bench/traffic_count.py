"""Bytes each device sends and receives in one training step, counted from the graph.

Given where every op of the step runs (bench/traffic_placement.py), what
crosses between devices is:

  Graph edges. A data input whose producer runs on another device than its
  consumer carries the tensor's bytes (static shape x dtype size) once per
  step. TensorFlow makes one Send/Recv pair per (tensor, destination
  device), however many ops there read the tensor, so transfers are
  deduplicated on that pair: a weight read by a tower's forward and backward
  ops crosses once. Control edges carry no data and are not counted.

  Collective ops, which are not edges. An all-reduce of S bytes among T
  devices is counted as the ring algorithm NCCL uses for large buffers moves
  it: each device sends and receives 2 (T - 1) / T x S (reduce-scatter, then
  all-gather, each T - 1 steps of S / T). An all-gather in which every device
  contributes S bytes (and ends with T x S): each device sends and receives
  (T - 1) x S.

The result, `Traffic`, keeps every transfer (so a table can break them down
by kind) and sums them per device (`Traffic.per_device`). From the busiest
device's bytes bench/traffic_rows.py derives the step-time floor: with one
full-duplex link of bandwidth W per device into a non-blocking fabric, and
no overlap of communication with compute or with itself, a step cannot take
less than max over devices of max(sent, received) / W.
"""

import collections
import dataclasses
from typing import Dict, Iterable, List, Optional, Tuple

import tensorflow as tf

from bench.traffic_placement import VARIABLE_OP_TYPES, place, step_ops

# Ops that read a variable's value (their output is the variable's bytes).
VARIABLE_READ_OP_TYPES = frozenset(["ReadVariableOp", "ResourceGather"])
ALL_REDUCE_OP_TYPES = frozenset(
    ["CollectiveReduce", "CollectiveReduceV2", "CollectiveReduceV3", "NcclAllReduce"])
ALL_GATHER_OP_TYPES = frozenset(["CollectiveGather", "CollectiveGatherV2"])


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
        """{device: (sent bytes, received bytes)}, every device of the step listed.

        Args:
          kinds: count only these edge kinds ('variable', 'input', 'computed')
            and, when it holds 'collective', the collectives; None: everything.
        """
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


def _tensor_bytes(tensor) -> Optional[int]:
    """Static size of a tensor in bytes; None for handles, strings and unknown shapes."""
    if tensor.dtype.base_dtype in (tf.resource, tf.variant, tf.string):
        return None
    elements = tensor.shape.num_elements()
    return None if elements is None else elements * tensor.dtype.base_dtype.size


def _group_size(op) -> int:
    """T of a collective op: an attribute (V1, NCCL) or a constant input (V2, V3)."""
    for attribute in ("group_size", "num_devices"):
        if attribute in op.node_def.attr:
            return int(op.get_attr(attribute))
    size = tf.get_static_value(op.inputs[1])  # the V2 ops take it as an input
    if size is None:
        raise ValueError(f"The group size of collective {op.name} is not static.")
    return int(size)


def _variable_free(ops) -> Dict[str, bool]:
    """{op name: True when the op computes from no variable} for the step's ops.

    Such tensors crossing devices are the input batch and constants: the
    'input' kind of EdgeTransfer.
    """
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
    """True for a variable's value (through Identities that are not of the handle)."""
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

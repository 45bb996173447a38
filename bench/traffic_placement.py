"""Which ops one training step runs, and on which device: TensorFlow's placer, simulated.

bench/traffic.py counts the bytes a step moves between devices; for that it
needs, without running anything (the graphs name GPUs the machine may not
have), the two things this module computes from the built graph:

  1. The step (`step_ops`): the ops the train op needs, walking back from it
     through data and control inputs. Initializers, savers and summaries are
     not in it: the replicated copies' initializers read tower 0's variables
     across devices, but once, not every step.
  2. Where each op runs (`place`), as TensorFlow's placer decides it for
     these graphs: the device the op asked for; ops colocated (the `_class`
     attribute) and ops taking a variable's resource handle go where the
     variable (or the colocation target) is, whatever they asked for; an op
     that asked for no device goes to the first GPU (the first CPU when there
     is no GPU), the placer's default.

tests/bench/test_traffic.py compares the result with the `_Send` ops of
TensorFlow's own partition graphs of the same step run on virtual CPUs.
"""

from typing import Dict, List, Optional

import tensorflow as tf

# Ops that own a variable's storage: everything taking its handle runs there.
VARIABLE_OP_TYPES = frozenset(
    ["VarHandleOp", "VariableV2", "Variable", "AutoReloadVariable", "_VarHandlesOp"])


def step_ops(fetches) -> List[tf.Operation]:
    """The ops running a step of `fetches` needs: data and control ancestors.

    Args:
      fetches: an op, a tensor, or a list of them (e.g. the train op).

    Returns:
      The ops in creation order (so that the placer's "first device asked
      for" below is the same from run to run).
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
    """'/gpu:1' -> '/device:GPU:1': one spelling per device, so that names compare."""
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

    Args:
      ops: the step's ops (`step_ops`); colocation targets outside them are
        looked up in their graph.
      default_device: where a group that asked for nothing runs; None: the
        placer's default, the first GPU the ops name (else CPU:0).

    Returns:
      {op name: canonical device string ('/device:GPU:0')} for every op of `ops`.
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

"""What each device holds, read from the built graph: weights, slots, gradients.

    towerlib.update.replica_bytes(train)
    # {'/device:CPU:0': {'weights': 1180, 'slots': 1624, 'gradients': 1180}, ...}

- weights: the bytes of the variables on the device that are no optimizer state
  (every copy of a weight, moving statistics, step counters);
- slots: the optimizer's state on the device: a variable named under another
  variable ('w/Adam', 'replicated/tower_1/w/Momentum'), and the optimizer's
  non-slot variables colocated there (Adam's 'beta1_power');
- gradients: the bytes of the trained variables' gradients computed on the device
  (each tower differentiates its own copies, or the shared variables).

Under Replicated() every tower holds all slots; with shard_update=True 1/N of
them, give or take one variable, and across W workers 1/(W x N)
(towerlib.update.sharded).
"""

import collections
from typing import Dict

import tensorflow as tf

__all__ = ["replica_bytes"]


def replica_bytes(train_graph) -> Dict[str, Dict[str, int]]:
    """{device: {'weights': bytes, 'slots': bytes, 'gradients': bytes}} of a TrainGraph.

    Shapes must be static (a variable of unknown shape counts 0 bytes).
    """
    graph = train_graph.train_op.graph
    with graph.as_default():
        variables = tf.compat.v1.global_variables() + tf.compat.v1.local_variables()
    names = {v.op.name for v in variables}
    held = collections.defaultdict(lambda: {"weights": 0, "slots": 0, "gradients": 0})
    for variable in variables:
        kind = "slots" if _is_optimizer_state(variable.op.name, names) else "weights"
        held[_device(variable)][kind] += _bytes(variable)
    for towers_pairs in _tower_pairs(train_graph):
        for gradient, variable in towers_pairs:
            if gradient is not None:
                held[_device(variable)]["gradients"] += _bytes(variable)
    return dict(held)


def _tower_pairs(train_graph):
    """Per tower, (gradient, variable) of the variables it trains: its copies when
    replicated, else the shared variables once (the towers' sum lives there)."""
    pairs = train_graph.grads_and_vars
    copies = train_graph.variable_copies
    if not copies:
        return [pairs]
    num_towers = len(next(iter(copies.values())))
    return [[(g, copies[v.op.name][tower]) for g, v in pairs if v.op.name in copies]
            for tower in range(num_towers)]


def _is_optimizer_state(name, names):
    parts = name.split("/")
    if any("/".join(parts[:end]) in names for end in range(1, len(parts))):
        return True
    return parts[-1].endswith("_power")  # Adam's beta1_power, beta2_power


def _device(variable):
    return tf.DeviceSpec.from_string(variable.device or "").to_string() or "(unplaced)"


def _bytes(variable):
    shape = variable.shape
    if not shape.is_fully_defined():
        return 0
    return shape.num_elements() * variable.dtype.base_dtype.size

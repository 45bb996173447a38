"""Rewiring one input of an op that already exists in a graph.

Relies on ``tf.Operation._update_input(index, tensor)``, a private method.
TensorFlow's own graph-mode while_loop uses it to close its back edges
(``control_flow_ops``), which is why it has stayed since TF 1.x. The graph
transport (towerlib.exchange.graph_hub) needs it because towers are built one
after the other: the hub op exists before the later towers' tensors do.
"""

import tensorflow as tf

__all__ = ["replace_input"]


def replace_input(op: tf.Operation, index: int, tensor: tf.Tensor) -> None:
    """Makes input `index` of `op` read `tensor` instead of what it read.

    `tensor` must have the input's dtype and a compatible shape and live in
    `op`'s graph. A Session that has already run the graph refuses to run it
    after this (the graph was mutated), so call it while building.
    """
    op._update_input(index, tensor)  # pylint: disable=protected-access

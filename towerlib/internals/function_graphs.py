"""The graphs a tf.while_loop body is built in, seen from the graph around it.

In TF 2.21 a graph-mode ``tf.compat.v1.while_loop`` (control flow v2) builds
its body in a FuncGraph: a tensor of the outer graph used inside appears
there as a Placeholder, a *capture*. towerlib builds the towers of an
accumulated step in such a body (towerlib.step.micro_loop) and walks their
ops backwards (the build-time checks), so a walk must be able to step out
through a capture to the outer tensor. Relies on FuncGraph's ``outer_graph``
and ``captures`` ((external, internal) pairs) attributes, and on
``Graph.create_op`` to re-create an op inside a branch.
"""

import tensorflow as tf

__all__ = ["captured_from", "copy_op", "is_inside"]


def captured_from(op: tf.Operation):
    """The outer tensor a body Placeholder `op` captures, or None for any other op."""
    if op.type != "Placeholder" or getattr(op.graph, "outer_graph", None) is None:
        return None
    for external, internal in op.graph.captures:
        if internal.op is op:
            return external
    return None


def is_inside(graph: tf.Graph, outer: tf.Graph) -> bool:
    """Whether `graph` is `outer` or a function body built within it (at any depth)."""
    while graph is not None:
        if graph is outer:
            return True
        graph = getattr(graph, "outer_graph", None)
    return False


def root_graph(graph: tf.Graph) -> tf.Graph:
    """The plain graph a function body (an accumulation loop's, say) is built inside."""
    while getattr(graph, "outer_graph", None) is not None:
        graph = graph.outer_graph
    return graph


def in_function_body(graph: tf.Graph) -> bool:
    return getattr(graph, "outer_graph", None) is not None


def copy_op(op: tf.Operation, name: str) -> tf.Operation:
    """A new op like `op` (type, inputs, attributes) in the current graph.

    Inputs from an enclosing graph are captured, so a copy made in a
    tf.cond branch runs only when that branch does; control inputs are
    copied as control dependencies.
    """
    graph = tf.compat.v1.get_default_graph()
    with tf.control_dependencies(op.control_inputs):
        return graph.create_op(
            op.type, list(op.inputs), [output.dtype for output in op.outputs],
            name=name, attrs=dict(op.node_def.attr))

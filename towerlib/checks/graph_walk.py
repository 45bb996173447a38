"""Walking a graph backwards from a tensor, for the build-time checks.

The checks on a tower's loss (towerlib.checks.tower_isolation, towerlib.step.loss_terms)
ask what a tensor was computed from. They walk the producing ops backwards
through data and control inputs and stop where the answer cannot change:
at variables (their value is the same whichever tower reads it) and
wherever the caller says to stop (e.g. at ops outside the towers). Each op
is visited once, so a walk costs at most the size of the graph it covers.
"""

from typing import Callable, Iterable, Iterator

import tensorflow as tf

from towerlib.internals import function_graphs

# Ops that hold a variable; a walk never goes past them.
VARIABLE_OP_TYPES = frozenset({
    "VarHandleOp", "VariableV2", "Variable", "AutoReloadVariable",
    "_VarHandlesOp", "MutableHashTableV2", "HashTableV2"})


def is_variable_read(op: tf.Operation) -> bool:
    """True for a variable op, a read of one, or the `read` snapshot of a ref variable.

    A read of a shared variable tells nothing about which tower's examples a
    tensor came from, whichever name scope the read was created in.
    """
    if op.type in VARIABLE_OP_TYPES:
        return True
    if op.type in ("ReadVariableOp", "Identity") and op.inputs:
        return source_op(op.inputs[0].op).type in VARIABLE_OP_TYPES
    return False


def source_op(op: tf.Operation) -> tf.Operation:
    """`op`, or for a loop body's capture of an outer tensor, that tensor's op.

    The towers of an accumulated step are built in a tf.while_loop body
    (towerlib.step.micro_loop), where a variable or an input of the graph
    around it appears as a Placeholder: a walk goes on through it.
    """
    while True:
        outer = function_graphs.captured_from(op)
        if outer is None:
            return op
        op = outer.op


def in_scope(op: tf.Operation, name_scope: str) -> bool:
    """Whether `op` was created under `name_scope` (ending in '/', e.g. 'tower_1/')."""
    return bool(name_scope) and op.name.startswith(name_scope)


def upstream_ops(start: Iterable[tf.Operation],
                 descend: Callable[[tf.Operation], bool]) -> Iterator[tf.Operation]:
    """Every op the `start` ops are computed from, nearest first (breadth first).

    Args:
      start: where the walk starts (e.g. `[loss.op]`); yielded first.
      descend: called once per op yielded; the walk goes on to the op's data
        and control inputs only when it returns True. Variable ops and
        variable reads are yielded but never descended into.

    Yields:
      each op reached, once.
    """
    frontier = list(start)
    seen = {op.name for op in frontier}
    while frontier:
        next_frontier = []
        for op in frontier:
            yield op
            if is_variable_read(op) or not descend(op):
                continue
            for parent in [source_op(t.op) for t in op.inputs] + list(op.control_inputs):
                if parent.name not in seen:
                    seen.add(parent.name)
                    next_frontier.append(parent)
        frontier = next_frontier

"""Building ops in a loop body under the device scopes open before the loop.

A control-flow body in TF 2.21 (``ControlFlowFuncGraph``) starts with a copy
of every device scope open around its loop, so each op built in it pays for
each of them: the scope is applied to the op (a device merge) and recorded
with it (``Operation._device_code_locations``, one object per scope and op).
The accumulation loop (towerlib.step.micro_loop) is built under a scope of
its own, the host CPU where its counter runs; its towers have no use for
it (their own scopes place every op), and their ~40k ops at 8 towers would
each pay for it. They are built under the scopes that were open before the
loop instead: those around build_train_graph, exactly what the towers see
at accumulation_steps = 1 (a user's tf.device, a replica_device_setter).

Relies on ``Graph._device_function_stack``, a private property with a
setter, which ``Graph.device`` pushes to and pops from (a TraceableStack
with ``copy()``).
"""

import contextlib

import tensorflow as tf

__all__ = ["open_scopes", "scopes_replaced_by"]


def open_scopes():
    """The default graph's device scopes open now (a copy, unchanged by later scopes)."""
    return tf.compat.v1.get_default_graph()._device_function_stack.copy()  # pylint: disable=protected-access


@contextlib.contextmanager
def scopes_replaced_by(scopes):
    """Within: ops of the default graph see `scopes` (from open_scopes()) instead of the
    scopes open now, and any opened inside.

        with tf.device("/job:worker/task:1"):
            before = open_scopes()
            with tf.device("/device:CPU:0"):                 # the loop's own scope
                with scopes_replaced_by(before):
                    a = tf.constant(1.0)                     # '/job:worker/task:1'
                    with tf.device("/device:GPU:1"):
                        b = tf.constant(2.0)                 # '/job:worker/task:1/device:GPU:1'
                c = tf.constant(3.0)                         # '/job:worker/task:1/device:CPU:0'

    The scopes open now are back on exit, errors included. tf.init_scope
    inside sees `scopes` and those opened inside; when both are empty it
    sees the scopes open when the current function graph was entered
    (TensorFlow's rule for an empty stack).
    """
    graph = tf.compat.v1.get_default_graph()
    scopes_now = graph._device_function_stack  # pylint: disable=protected-access
    graph._device_function_stack = scopes.copy()  # pylint: disable=protected-access
    try:
        yield
    finally:
        graph._device_function_stack = scopes_now  # pylint: disable=protected-access

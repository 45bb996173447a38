"""Building ops in a loop body without the device scopes around the loop.

A control-flow body in TF 2.21 (``ControlFlowFuncGraph``) starts with a copy
of the device scopes open around the loop, so every op built in it pays for
each of them: the scope is applied to the op (a device merge) and recorded
with it (``Operation._device_code_locations``, one object per scope and op).
The towers of an accumulated step (towerlib.step.micro_loop) carry their
own device scopes, which decide every device, so the host scope the loop is
built in is pure cost for their ~40k ops at 8 towers.

Relies on ``Graph._device_function_stack``, a private property with a
setter, which ``Graph.device`` pushes to and pops from (a TraceableStack).
"""

import contextlib

import tensorflow as tf

__all__ = ["outer_device_scopes_set_aside"]


@contextlib.contextmanager
def outer_device_scopes_set_aside():
    """Within: ops of the default graph get only the device scopes opened inside.

        with tf.device("/device:CPU:0"):
            with outer_device_scopes_set_aside():
                a = tf.constant(1.0)                 # device ''
                with tf.device("/device:GPU:1"):
                    b = tf.constant(2.0)             # '/device:GPU:1'
            c = tf.constant(3.0)                     # '/device:CPU:0'

    The scopes are back on exit, errors included. tf.init_scope inside sees
    the scopes opened inside, as it would see the loop's.
    """
    graph = tf.compat.v1.get_default_graph()
    outer_scopes = graph._device_function_stack  # pylint: disable=protected-access
    graph._device_function_stack = type(outer_scopes)()  # pylint: disable=protected-access
    try:
        yield
    finally:
        graph._device_function_stack = outer_scopes  # pylint: disable=protected-access

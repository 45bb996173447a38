"""A graph variable's initializer replaced by an assignment of a value of one's own.

`tf.compat.v1.global_variables_initializer()` groups each variable's
`initializer`; the replicated copies are initialized from a read of the
variable. To give a variable another step-0 value without a session, its
initializer op and initial value are replaced, as TensorFlow's own
`tf.compat.v1.train.init_from_checkpoint` does: the private attributes
`_initializer_op` and `_initial_value` of a graph-mode ResourceVariable.
Run before the initializer op is made (a Scaffold makes it when finalized).

tests/internals/test_internals_variable_initializers.py fails if a release
renames them.
"""

import tensorflow as tf

__all__ = ["replace_initial_value"]


def replace_initial_value(variable, value):
    """`variable`'s initializer assigns `value` (a numpy array of its shape) instead.

    The value is a constant colocated with the variable (on its device, a ps
    task's across machines), so every process that builds the graph holds it.
    """
    if not hasattr(variable, "_initializer_op") or not hasattr(variable, "_initial_value"):
        raise AttributeError(
            f"towerlib relies on {type(variable).__name__}._initializer_op and "
            "._initial_value (as tf.compat.v1.train.init_from_checkpoint does); this "
            "TensorFlow release has neither.")
    graph = variable.graph
    with graph.as_default(), tf.control_dependencies(None), \
            tf.compat.v1.colocate_with(variable.op), tf.name_scope(variable.op.name + "/held/"):
        initial = tf.constant(value, dtype=variable.dtype.base_dtype, name="value")
        initial.set_shape(variable.shape)
        assign = tf.raw_ops.AssignVariableOp(resource=variable.handle, value=initial,
                                             name="assign")
    variable._initializer_op = assign  # noqa: SLF001 (see the module docstring)
    variable._initial_value = initial  # noqa: SLF001
    return assign

"""towerlib.internals.device_scopes: a loop body's ops without the loop's device scopes.

The accumulation loop (towerlib.step.micro_loop) builds its towers this way;
each test fails naming the module if a release changes what it relies on.
"""

import pytest
import tensorflow as tf

from towerlib.internals import device_scopes


def _broken(detail):
    pytest.fail(f"TensorFlow {tf.__version__}: towerlib.internals.device_scopes relies on "
                f"{detail}", pytrace=False)


def _scopes_recorded(op):
    return len(op._device_code_locations or [])  # pylint: disable=protected-access


def test_tensorflow_keeps_a_settable_device_scope_stack_and_copies_it_into_a_loop_body():
    graph = tf.Graph()
    if not isinstance(getattr(type(graph), "_device_function_stack", None), property) \
            or type(graph)._device_function_stack.fset is None:
        _broken("Graph._device_function_stack being a property with a setter")
    with graph.as_default(), tf.device("/device:CPU:0"):
        seen = {}

        def body(index):
            seen["op"] = tf.identity(index).op
            return index + 1

        tf.compat.v1.while_loop(lambda index: index < 1, body, [tf.constant(0)])
    if seen["op"].device != "/device:CPU:0" or _scopes_recorded(seen["op"]) != 1:
        _broken("a while-loop body starting with the device scopes around the loop "
                f"(an op in it: device {seen['op'].device!r}, "
                f"{_scopes_recorded(seen['op'])} scopes recorded)")


def test_ops_inside_get_only_the_scopes_opened_inside_and_the_outer_ones_come_back():
    with tf.Graph().as_default():
        with tf.device("/job:worker/task:1/device:CPU:0"):
            with device_scopes.outer_device_scopes_set_aside():
                bare = tf.constant(1.0, name="bare")
                with tf.device("/device:GPU:1"):
                    inner = tf.constant(2.0, name="inner")
            after = tf.constant(3.0, name="after")
        assert bare.op.device == ""
        assert _scopes_recorded(bare.op) == 0
        assert inner.op.device == "/device:GPU:1"
        assert _scopes_recorded(inner.op) == 1
        assert after.op.device == "/job:worker/task:1/device:CPU:0"


def test_the_outer_scopes_come_back_after_an_error():
    with tf.Graph().as_default():
        with tf.device("/device:CPU:0"):
            with pytest.raises(RuntimeError, match="in the middle"):
                with device_scopes.outer_device_scopes_set_aside():
                    raise RuntimeError("in the middle")
            assert tf.constant(1.0).op.device == "/device:CPU:0"


def test_in_a_loop_body_the_towers_scope_alone_places_and_is_recorded():
    with tf.Graph().as_default():
        seen = {}

        def body(index):
            with device_scopes.outer_device_scopes_set_aside(), tf.device("/device:CPU:1"):
                seen["tower"] = tf.identity(index).op
            seen["counter"] = (index + 1).op
            return index + 1

        with tf.device("/device:CPU:0"):
            tf.compat.v1.while_loop(lambda index: index < 1, body, [tf.constant(0)])
        assert seen["tower"].device == "/device:CPU:1"
        assert _scopes_recorded(seen["tower"]) == 1
        assert seen["counter"].device == "/device:CPU:0"  # the loop's scope, back

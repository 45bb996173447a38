"""towerlib.internals.device_scopes: a loop body's ops under the scopes open before the loop.

The accumulation loop (towerlib.step.micro_loop) builds its towers this way;
each test fails naming the module if a release changes what it relies on,
and the step-level tests check that an accumulated step is placed as one of
k = 1 is under the scopes a user opens around the build.
"""

import contextlib

import pytest
import tensorflow as tf

from tests.internals.tiny_step import build_tiny_step
from towerlib.internals import device_scopes


def _broken(detail):
    pytest.fail(f"TensorFlow {tf.__version__}: towerlib.internals.device_scopes relies on "
                f"{detail}", pytrace=False)


def _scopes_recorded(op):
    return len(op._device_code_locations or [])  # pylint: disable=protected-access


def test_tensorflow_keeps_a_settable_device_scope_stack_and_copies_it_into_a_loop_body():
    graph = tf.Graph()
    stack_property = getattr(type(graph), "_device_function_stack", None)
    if not isinstance(stack_property, property) or stack_property.fset is None:
        _broken("Graph._device_function_stack being a property with a setter")
    if not callable(getattr(graph._device_function_stack, "copy", None)):  # pylint: disable=protected-access
        _broken("the device scope stack having copy()")
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


def test_ops_inside_see_the_earlier_scopes_and_those_opened_inside_then_the_current_ones():
    with tf.Graph().as_default():
        with tf.device("/job:worker/task:1"):
            before = device_scopes.open_scopes()
            with tf.device("/device:CPU:0"):
                with device_scopes.scopes_replaced_by(before):
                    bare = tf.constant(1.0, name="bare")
                    with tf.device("/device:GPU:1"):
                        inner = tf.constant(2.0, name="inner")
                after = tf.constant(3.0, name="after")
        assert bare.op.device == "/job:worker/task:1"
        assert _scopes_recorded(bare.op) == 1
        assert inner.op.device == "/job:worker/task:1/device:GPU:1"
        assert after.op.device == "/job:worker/task:1/device:CPU:0"


def test_a_snapshot_is_not_changed_by_scopes_opened_after_it_or_inside():
    with tf.Graph().as_default():
        before = device_scopes.open_scopes()
        with tf.device("/device:CPU:3"):
            with device_scopes.scopes_replaced_by(before):
                with tf.device("/device:CPU:2"):
                    pass
                assert tf.constant(0.0).op.device == ""
            with device_scopes.scopes_replaced_by(before):
                assert tf.constant(0.0).op.device == ""


def test_the_current_scopes_come_back_after_an_error():
    with tf.Graph().as_default():
        before = device_scopes.open_scopes()
        with tf.device("/device:CPU:0"):
            with pytest.raises(RuntimeError, match="in the middle"):
                with device_scopes.scopes_replaced_by(before):
                    raise RuntimeError("in the middle")
            assert tf.constant(1.0).op.device == "/device:CPU:0"


def test_in_a_loop_body_the_towers_scope_alone_places_and_is_recorded():
    with tf.Graph().as_default():
        seen = {}
        before = device_scopes.open_scopes()

        def body(index):
            with device_scopes.scopes_replaced_by(before), tf.device("/device:CPU:1"):
                seen["tower"] = tf.identity(index).op
            seen["counter"] = (index + 1).op
            return index + 1

        with tf.device("/device:CPU:0"):
            tf.compat.v1.while_loop(lambda index: index < 1, body, [tf.constant(0)])
        assert seen["tower"].device == "/device:CPU:1"
        assert _scopes_recorded(seen["tower"]) == 1
        assert seen["counter"].device == "/device:CPU:0"  # the loop's scope, back


def _devices_of_a_step(accumulation_steps, outer_scope, set_aside=True, monkeypatch=None):
    """{node name: device} of a two-tower step built under `outer_scope`, the loop's
    body included (its nodes as 'body/<name>')."""
    if not set_aside:
        monkeypatch.setattr(device_scopes, "scopes_replaced_by",
                            lambda scopes: contextlib.nullcontext())
    graph = tf.Graph()
    with graph.as_default():
        build_tiny_step(accumulation_steps=accumulation_steps, update="parameter_server",
                        bn_mode="first_tower", batch_norm=False, outer_scope=outer_scope)
    graph_def = graph.as_graph_def()
    devices = {node.name: node.device for node in graph_def.node}
    for function in graph_def.library.function:
        if "body" in function.signature.name:
            devices.update({f"body/{node.name}": node.device for node in function.node_def})
    return devices


@pytest.mark.parametrize("outer", ["worker", "replica_device_setter"])
def test_an_accumulated_step_keeps_the_scopes_around_the_build_as_k1_does(outer):
    """A user's tf.device or replica_device_setter around build_train_graph places
    the variables and the towers at k = 2 as at k = 1."""
    def outer_scope():
        if outer == "worker":
            return tf.device("/job:worker/task:1")
        return tf.compat.v1.device(tf.compat.v1.train.replica_device_setter(
            ps_tasks=2, worker_device="/job:worker/task:1"))

    k1, k2 = _devices_of_a_step(1, outer_scope), _devices_of_a_step(2, outer_scope)
    for name in ("w", "w/Momentum"):
        assert k2[name] == k1[name], name
    if outer == "replica_device_setter":
        assert k2["w"].startswith("/job:ps/")
    matmuls = {name: device for name, device in k2.items()  # forward and gradient
               if name.startswith("body/tower_") and name.endswith("MatMul")}
    assert len(matmuls) == 4, matmuls
    for name, device in matmuls.items():
        tower = name.split("/")[1].split("_")[1]
        assert device == f"/job:worker/task:1/device:CPU:{tower}", (name, device)


def test_without_scopes_around_the_build_only_the_towers_shares_lose_the_host(monkeypatch):
    """What setting the loop's host scope aside changes: the towers' n / B ops, placed
    by no tower scope, are unplaced as at k = 1; every other op keeps its device."""
    set_aside = _devices_of_a_step(2, contextlib.nullcontext)
    kept = _devices_of_a_step(2, contextlib.nullcontext, set_aside=False,
                              monkeypatch=monkeypatch)
    assert set_aside.keys() == kept.keys()
    changed = {name: (kept[name], set_aside[name]) for name in kept
               if kept[name] != set_aside[name]}
    assert changed, "the loop's host scope no longer reaches the body: update this test"
    for name, (before, after) in changed.items():
        assert name.startswith("body/") and before == "/device:CPU:0" and after == "", name
        assert name.split("/")[-1].split("_")[0] in ("Cast", "truediv"), name

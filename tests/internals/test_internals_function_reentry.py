"""towerlib.internals.function_reentry: re-entering a loop body as the default graph.

The accumulation loop (towerlib.step.micro_loop) builds its body under
plain_reentry; each test fails naming the module if a release changes what
it relies on.
"""

import contextlib
import inspect
import re

import pytest
import tensorflow as tf
from tensorflow.python.framework import func_graph

from tests.internals.graph_text import canonical_graph_text
from tests.internals.tiny_step import build_tiny_step
from towerlib.internals import function_reentry


def _broken(detail):
    pytest.fail(f"TensorFlow {tf.__version__}: towerlib.internals.function_reentry relies on "
                f"{detail}", pytrace=False)


def _in_body(build):
    """Runs build(index) once inside a one-iteration while_loop body."""

    def body(index):
        build(index)
        return index + 1

    return tf.compat.v1.while_loop(lambda index: index < 1, body, [tf.constant(0)])


def _with_device_function(graph):
    """A device function on the stack (FuncGraph.as_default then copies the stack) that
    leaves an op's own request be."""
    return graph.device(lambda op: op.device or "/device:CPU:0")


def test_tensorflow_reenters_the_body_for_each_op_through_an_overridable_method():
    entries = []

    def build(index):
        graph = tf.compat.v1.get_default_graph()
        if not inspect.ismethod(graph.as_default):
            _broken("FuncGraph.as_default being a method of the class")
        own_entry = graph.as_default

        def counting():
            entries.append(1)
            return own_entry()

        graph.as_default = counting
        try:
            tf.identity(index)
        finally:
            del graph.as_default
        if not inspect.ismethod(graph.as_default):
            _broken("deleting an instance attribute bringing back the class's as_default")

    with tf.Graph().as_default():
        _in_body(build)
    if not entries:
        _broken("an op wrapper re-entering its graph as the default (with g.as_default())")


def test_inside_the_shortcut_the_body_builds_the_same_ops_on_the_same_devices():
    def graph_def(shortcut):
        with tf.Graph().as_default() as graph:
            outer = tf.constant([1.0, 2.0], name="outer")

            def build(index):
                body = tf.compat.v1.get_default_graph()
                scope = (function_reentry.plain_reentry(body) if shortcut
                         else contextlib.nullcontext())
                with scope, _with_device_function(body):
                    value = tf.reduce_sum(outer * tf.cast(index, tf.float32))
                    with tf.device("/device:CPU:1"):
                        tf.identity(value, name="on_cpu_1")

            _in_body(build)
        return graph

    with_shortcut, without = graph_def(True), graph_def(False)
    assert canonical_graph_text(with_shortcut) == canonical_graph_text(without)
    devices = {node.name: node.device
               for function in with_shortcut.as_graph_def().library.function
               if "body" in function.signature.name for node in function.node_def}
    assert devices["on_cpu_1"] == "/device:CPU:1" and devices["Sum"] == "/device:CPU:0"


def test_entries_take_the_plain_path_only_while_the_body_is_the_default():
    """Entered while another graph is the default, the body still copies that graph's
    device scopes (FuncGraph's own path): an op built then gets the other's device."""
    seen = {}

    def build(index):
        body = tf.compat.v1.get_default_graph()
        with function_reentry.plain_reentry(body):
            with body.as_default() as entered:
                seen["entered"] = entered
            with tf.Graph().as_default() as other, \
                    other.device(lambda op: op.device or "/device:CPU:3"):
                with body.as_default():
                    seen["inside"] = tf.compat.v1.get_default_graph()
                    seen["device"] = tf.constant(1.0).op.device
            seen["shortcut"] = not inspect.ismethod(body.as_default)
        seen["restored"] = inspect.ismethod(body.as_default)
        seen["body"] = body

    with tf.Graph().as_default():
        _in_body(build)
    assert seen["entered"] is seen["body"] and seen["inside"] is seen["body"]
    assert seen["device"] == "/device:CPU:3"
    assert seen["shortcut"] and seen["restored"]


def test_the_entry_it_skips_sets_only_what_it_argues_about():
    """FuncGraph's entry, skipped when the body is already the default: plain_reentry's
    argument covers the attributes it sets today; a new one needs a new look."""
    entry = getattr(func_graph, "_func_graph_as_default_inner_cm", None)
    if entry is None:
        _broken("FuncGraph.as_default's _func_graph_as_default_inner_cm")
    source = inspect.getsource(entry)
    assigned = set(re.findall(r"func_graph\.(_\w+)\s*=", source))
    expected = {"_distribution_strategy_stack", "_device_function_stack",
                "_variable_creator_stack", "_graph_key", "_scope_exit_callbacks"}
    if assigned != expected:
        _broken(f"FuncGraph.as_default setting {sorted(expected)}; it sets {sorted(assigned)}")


def test_the_class_method_comes_back_after_an_error_and_nesting_is_harmless():
    seen = {}

    def build(index):
        body = tf.compat.v1.get_default_graph()
        with pytest.raises(RuntimeError, match="midway"):
            with function_reentry.plain_reentry(body):
                with function_reentry.plain_reentry(body):  # nested: a no-op
                    tf.identity(index)
                seen["still_shortcut"] = not inspect.ismethod(body.as_default)
                raise RuntimeError("midway")
        seen["restored"] = inspect.ismethod(body.as_default)

    with tf.Graph().as_default():
        _in_body(build)
    assert seen == {"still_shortcut": True, "restored": True}


def test_a_plain_graph_is_left_as_it_is():
    graph = tf.Graph()
    with function_reentry.plain_reentry(graph):
        assert inspect.ismethod(graph.as_default)


def test_an_accumulated_step_builds_the_same_graph(monkeypatch):
    """The loop body (sync batch norm, replicated variables, a device function
    per tower) with and without the shortcut."""
    def build():
        graph = tf.Graph()
        with graph.as_default():
            for update in ("replicated", "parameter_server"):
                with tf.compat.v1.variable_scope(update):
                    build_tiny_step(update=update)
        return graph

    shortcut = build()
    monkeypatch.setattr(function_reentry, "plain_reentry",
                        lambda graph: contextlib.nullcontext())
    plain = build()
    assert canonical_graph_text(shortcut) == canonical_graph_text(plain)

"""towerlib.internals.gradient_captures: tf.gradients in a body, captures looked up by index.

The context swaps two private functions of tensorflow.python.ops.gradients_util
for indexed ones; it must build the very same graph. Each test builds a graph
with and without it and compares them byte for byte (function names, which carry
a process-wide counter, aside).
"""

import contextlib
import re

import numpy as np
import pytest
import tensorflow as tf

import towerlib
from towerlib.internals import gradient_captures
from tensorflow.python.ops import gradients_util


def _broken(detail):
    pytest.fail(f"TensorFlow {tf.__version__}: towerlib.internals.gradient_captures relies on "
                f"{detail}", pytrace=False)


def _canonical(graph):
    """The GraphDef as text without the process-wide counters in names (functions',
    custom gradients'), the functions in name order (the library's follows the counters)."""
    graph_def = graph.as_graph_def()
    names = {f.signature.name: re.sub(r"_\d+$", "", f.signature.name)
             for f in graph_def.library.function}

    def renamed(text):
        for name, canonical in names.items():
            text = re.sub(rf"\b{re.escape(name)}(?!\d)", canonical, text)
        return text

    def renumbered(text):  # tf.custom_gradient's ids count across the process too
        ids = {}
        return re.sub(r"CustomGradient-(\d+)",
                      lambda m: f"CustomGradient-{ids.setdefault(m.group(1), len(ids))}", text)

    nodes = renumbered(renamed("".join(str(node) for node in graph_def.node)))
    functions = sorted(renumbered(renamed(str(f))) for f in graph_def.library.function)
    return nodes, functions


def _gradients_in_nested_bodies():
    """Gradients taken in a tf.cond inside a while body, of outer variables:
    a dense weight read twice, an embedding gathered, an outer constant."""
    graph = tf.Graph()
    with graph.as_default():
        weights = tf.compat.v1.get_variable("weights", initializer=tf.ones([3, 2]))
        table = tf.compat.v1.get_variable("table", initializer=tf.ones([5, 3]))
        scale = tf.constant(0.5, name="scale")
        found = []

        def body(index):
            rows = tf.nn.embedding_lookup(table, tf.stack([index, index + 1]))  # [2, 3]

            def branch():
                loss = tf.reduce_sum(tf.matmul(rows, weights) * scale)
                loss += tf.reduce_sum(tf.square(weights))
                gradients = tf.gradients(loss, [weights, table])
                found.append(gradients)
                return tf.add_n([tf.reduce_sum(gradients[0]),
                                 tf.reduce_sum(gradients[1].values)])

            total = tf.cond(index < 2, branch, lambda: tf.constant(0.0))
            with tf.control_dependencies([total]):
                return index + 1

        tf.compat.v1.while_loop(lambda index: index < 3, body, [tf.constant(0)])
    return graph, found


def test_the_functions_it_replaces_are_there():
    if not gradient_captures.available():
        _broken("tensorflow.python.ops.gradients_util._Consumers(t, func_graphs), "
                "_MaybeCaptured(t) and _IsFunction(graph); without them towerlib builds "
                "accumulation loops slower (not wrongly)")


def test_gradients_in_nested_bodies_build_the_same_graph_and_are_connected():
    plain, plain_found = _gradients_in_nested_bodies()
    with gradient_captures.indexed_capture_lookups():
        indexed, indexed_found = _gradients_in_nested_bodies()
    assert all(g is not None for g in indexed_found[0])
    assert isinstance(indexed_found[0][1], tf.IndexedSlices)
    assert _canonical(indexed) == _canonical(plain)


def test_an_accumulated_step_builds_the_same_graph(monkeypatch):
    def build():
        graph = tf.Graph()
        with graph.as_default():
            images = tf.constant(np.linspace(-1, 1, 8 * 6, dtype=np.float32).reshape(8, 6))
            labels = tf.constant([0, 1, 2, 0, 1, 2, 0, 1])

            def tower_fn(inputs, ctx):
                x, y = inputs
                hidden = tf.matmul(x, tf.compat.v1.get_variable("w", [6, 3]))
                hidden = towerlib.batch_norm(hidden, ctx, name="bn")
                return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                    labels=y, logits=hidden))

            towerlib.build_train_graph(
                tower_fn, (images, labels), tf.compat.v1.train.MomentumOptimizer(0.1, 0.9),
                devices=["/device:CPU:0", "/device:CPU:1"], accumulation_steps=2,
                update="replicated", bn_mode="sync")
        return graph

    indexed = build()
    monkeypatch.setattr(gradient_captures, "indexed_capture_lookups", contextlib.nullcontext)
    plain = build()
    assert _canonical(indexed) == _canonical(plain)


def test_the_swap_lasts_while_any_entry_lasts_and_is_undone_after():
    original = gradients_util._Consumers  # pylint: disable=protected-access
    with gradient_captures.indexed_capture_lookups():
        swapped = gradients_util._Consumers  # pylint: disable=protected-access
        assert swapped is not original
        with gradient_captures.indexed_capture_lookups():
            pass
        assert gradients_util._Consumers is swapped  # pylint: disable=protected-access
    assert gradients_util._Consumers is original  # pylint: disable=protected-access
    with pytest.raises(RuntimeError):
        with gradient_captures.indexed_capture_lookups():
            raise RuntimeError("a build that fails")
    assert gradients_util._Consumers is original  # pylint: disable=protected-access

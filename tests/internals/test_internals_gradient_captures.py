"""towerlib.internals.gradient_captures: tf.gradients in a body, captures looked up by index.

The context swaps two private functions of tensorflow.python.ops.gradients_util
for indexed ones; it must build the very same graph. Each test builds a graph
with and without it and compares them byte for byte (function names, which carry
a process-wide counter, aside).
"""

import collections
import contextlib
import threading

import pytest
import tensorflow as tf
from tensorflow.python.ops import gradients_util

from tests.internals.graph_text import canonical_graph_text
from tests.internals.tiny_step import build_tiny_step
from towerlib.internals import gradient_captures


def _broken(detail):
    pytest.fail(f"TensorFlow {tf.__version__}: towerlib.internals.gradient_captures relies on "
                f"{detail}", pytrace=False)


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


def test_the_functions_it_replaces_are_there_and_called():
    if not gradient_captures.available():
        _broken("tensorflow.python.ops.gradients_util._Consumers(t, func_graphs), "
                "_MaybeCaptured(t) and _IsFunction(graph); without them towerlib builds "
                "accumulation loops slower (not wrongly)")
    calls = collections.Counter()
    original = gradient_captures._CaptureIndex.consumers  # pylint: disable=protected-access

    def counted(self, tensor, func_graphs):
        calls["consumers"] += 1
        return original(self, tensor, func_graphs)

    with _patched(gradient_captures._CaptureIndex, "consumers", counted), \
            gradient_captures.indexed_capture_lookups():
        _gradients_in_nested_bodies()
    if not calls["consumers"]:
        _broken("tf.gradients calling gradients_util._Consumers while it walks a body; "
                "it no longer does, so indexing its lookups no longer speeds anything up")


def test_tensorflow_caches_a_function_graphs_captures_list_until_they_change():
    """The index is keyed on the list object: it must be the same until a change."""
    seen = {}
    with tf.Graph().as_default():
        outer = [tf.constant(float(i), name=f"outer_{i}") for i in range(3)]
        _in_body(lambda: seen.update(graph=tf.compat.v1.get_default_graph(),
                                     inner=outer[0] * 2.0))
        body = seen["graph"]
        before = body.captures
        if body.captures is not before:
            _broken("FuncGraph.captures returning its cached list until the captures change")
        with body.as_default():
            body.capture(outer[1])
        after_capture = body.captures
        with body.as_default():
            placeholder = tf.compat.v1.placeholder(tf.float32, [], name="replacement")
            body.replace_capture(outer[1], placeholder)
        after_replace = body.captures
        lists = [before, after_capture, after_replace]
        if len({id(x) for x in lists}) != 3:
            _broken("FuncGraph.captures being a new list after capture() and replace_capture()")
        assert (outer[1], placeholder) in [(o, i) for o, i in after_replace]


def _in_body(build):
    """Runs build() once inside a one-iteration while_loop body."""
    def body(index):
        build()
        return index + 1

    tf.compat.v1.while_loop(lambda index: index < 1, body, [tf.constant(0)])


@contextlib.contextmanager
def _patched(owner, name, value):
    saved = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, saved)


def test_lookups_equal_tensorflows_for_every_tensor_also_after_captures_change():
    plain_consumers = gradients_util._Consumers  # pylint: disable=protected-access
    plain_maybe_captured = gradients_util._MaybeCaptured  # pylint: disable=protected-access
    index = gradient_captures._CaptureIndex()  # pylint: disable=protected-access
    seen = {}
    with tf.Graph().as_default() as graph:
        outer = [tf.constant(float(i + 1), name=f"outer_{i}") for i in range(4)]

        def build():
            body = tf.compat.v1.get_default_graph()

            def branch():
                seen["branch"] = tf.compat.v1.get_default_graph()
                return outer[0] * outer[1] + outer[0]

            seen.update(body=body, value=tf.cond(outer[2] > 0.0, branch,
                                                 lambda: outer[1] * 1.0))

        _in_body(build)
        graphs = [seen["branch"], seen["body"]]

        def check():
            tensors = [t for g in [graph] + graphs for op in g.get_operations()
                       for t in op.outputs]
            for tensor in tensors:
                mine = index.consumers(tensor, graphs)
                theirs = plain_consumers(tensor, graphs)
                assert [id(op) for op in mine] == [id(op) for op in theirs], tensor
                assert index.maybe_captured(tensor) is plain_maybe_captured(tensor), tensor

        check()
        with seen["body"].as_default():
            seen["body"].capture(outer[3])          # a capture added
        check()
        with seen["body"].as_default():
            replacement = tf.compat.v1.placeholder(tf.float32, [], name="replacement")
            seen["body"].replace_capture(outer[3], replacement)   # and one replaced
        check()
        assert index.maybe_captured(replacement) is outer[3]


def test_gradients_in_nested_bodies_build_the_same_graph_and_are_connected():
    plain, plain_found = _gradients_in_nested_bodies()
    with gradient_captures.indexed_capture_lookups():
        indexed, indexed_found = _gradients_in_nested_bodies()
    assert all(g is not None for g in indexed_found[0])
    assert isinstance(indexed_found[0][1], tf.IndexedSlices)
    assert canonical_graph_text(indexed) == canonical_graph_text(plain)


def test_an_accumulated_step_builds_the_same_graph(monkeypatch):
    def build():
        graph = tf.Graph()
        with graph.as_default():
            build_tiny_step()
        return graph

    indexed = build()
    monkeypatch.setattr(gradient_captures, "indexed_capture_lookups", contextlib.nullcontext)
    plain = build()
    assert canonical_graph_text(indexed) == canonical_graph_text(plain)


def _swapped_functions():
    return (gradients_util._Consumers, gradients_util._MaybeCaptured)  # pylint: disable=protected-access


def test_the_swap_lasts_while_any_entry_lasts_and_is_undone_after():
    originals = _swapped_functions()
    with gradient_captures.indexed_capture_lookups():
        swapped = _swapped_functions()
        assert all(s is not o for s, o in zip(swapped, originals))
        with gradient_captures.indexed_capture_lookups():
            pass
        assert _swapped_functions() == swapped
    assert _swapped_functions() == originals
    with pytest.raises(RuntimeError):
        with gradient_captures.indexed_capture_lookups():
            raise RuntimeError("a build that fails")
    assert _swapped_functions() == originals


def test_overlapping_entries_from_two_threads_restore_at_the_last_exit():
    originals = _swapped_functions()
    entered, first_left, results = threading.Event(), threading.Event(), {}

    def second_thread():
        with gradient_captures.indexed_capture_lookups():
            entered.set()
            first_left.wait(timeout=30)
            results["while_second_inside"] = _swapped_functions()

    thread = threading.Thread(target=second_thread)
    with gradient_captures.indexed_capture_lookups():
        thread.start()
        assert entered.wait(timeout=30)
    first_left.set()
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert results["while_second_inside"] != originals
    assert _swapped_functions() == originals


def test_two_gradient_calls_in_one_body_the_second_on_a_newly_captured_variable():
    def build():
        graph = tf.Graph()
        found = []
        with graph.as_default():
            first = tf.compat.v1.get_variable("first", initializer=tf.ones([2]))
            second = tf.compat.v1.get_variable("second", initializer=tf.ones([2]))

            def body(index):
                loss = tf.reduce_sum(first * first)
                found.append(tf.gradients(loss, [first])[0])
                # `second` is captured only now, after the first call indexed the body.
                loss_2 = tf.reduce_sum(second * first * 3.0)
                found.append(tf.gradients(loss_2, [second])[0])
                with tf.control_dependencies(found[-2:]):
                    return index + 1

            tf.compat.v1.while_loop(lambda index: index < 2, body, [tf.constant(0)])
        return graph, found

    plain, _ = build()
    with gradient_captures.indexed_capture_lookups():
        indexed, found = build()
    assert all(gradient is not None for gradient in found)
    assert canonical_graph_text(indexed) == canonical_graph_text(plain)

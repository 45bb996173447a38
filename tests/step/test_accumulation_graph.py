"""The graph accumulation builds: the towers once, in a loop.

The tests check that the graph (with its function library, where the
loop's body is) is the same size whatever k, that it sorts topologically,
and that TensorFlow's graph optimizer logs no failed topological sort on
the first step.
"""

import collections
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import towerlib
from tests import helpers
from towerlib import layers

# What grappler logs when it cannot sort the graph (layout optimizer, dependency optimizer).
SORT_FAILURES = ("couldn't be sorted in topological order", "topological sort failed")


def dense_tanh_dense(inputs, ctx):
    del ctx
    x, y = inputs
    h = tf.tanh(layers.dense(x, 8, name="d1"))
    return tf.reduce_mean(tf.square(layers.dense(h, 1, name="d2") - y))


def _build(num_towers, accumulation_steps, batch=32):
    graph = tf.Graph()
    with graph.as_default():
        rng = np.random.RandomState(0)
        inputs = (tf.constant(rng.randn(batch, 4).astype(np.float32)),
                  tf.constant(rng.randn(batch, 1).astype(np.float32)))
        train = towerlib.build_train_graph(
            dense_tanh_dense, inputs, tf.compat.v1.train.GradientDescentOptimizer(0.1),
            num_towers=num_towers, accumulation_steps=accumulation_steps)
    return graph, train


def _size(graph):
    """(nodes, bytes) of the GraphDef, its function library included."""
    graph_def = graph.as_graph_def()
    nodes = len(graph_def.node) + sum(len(f.node_def) for f in graph_def.library.function)
    return nodes, graph_def.ByteSize()


def _unsorted_nodes(graph_def):
    """Nodes Kahn's algorithm cannot place: those on a cycle or after one.

    Like grappler's sort, a NextIteration -> Merge edge (a while loop's back
    edge) does not count; every other edge, data or control, does.
    """
    ops = {node.name: node.op for node in graph_def.node}
    waiting, following = collections.Counter(), collections.defaultdict(list)
    for node in graph_def.node:
        for name in node.input:
            source = name.lstrip("^").split(":")[0]
            if ops[source] in ("NextIteration", "RefNextIteration") and node.op in (
                    "Merge", "RefMerge"):
                continue
            following[source].append(node.name)
            waiting[node.name] += 1
    ready = [name for name in ops if not waiting[name]]
    placed = set()
    while ready:
        name = ready.pop()
        placed.add(name)
        for after in following[name]:
            waiting[after] -= 1
            if not waiting[after]:
                ready.append(after)
    return sorted(set(ops) - placed)


@pytest.mark.parametrize("num_towers,accumulation_steps", [(1, 2), (1, 4), (2, 3)])
def test_graph_sorts_topologically(num_towers, accumulation_steps):
    """The graph around the loop, and every function (the loop's body, its branches)."""
    graph, _ = _build(num_towers, accumulation_steps)
    graph_def = graph.as_graph_def()
    assert _unsorted_nodes(graph_def) == []
    assert graph_def.library.function  # the loop's body is there
    for function in graph_def.library.function:
        body = tf.compat.v1.GraphDef()
        names = {node.name for node in function.node_def}
        for node in function.node_def:  # inputs 'op:output:0', '^op' or an argument
            copy = body.node.add()
            copy.name, copy.op = node.name, node.op
            copy.input.extend(i for i in node.input if i.lstrip("^").split(":")[0] in names)
        assert _unsorted_nodes(body) == [], function.signature.name


@pytest.mark.parametrize("num_towers", [1, 2])
def test_the_graph_does_not_grow_with_the_micro_batches(num_towers):
    """The same nodes at k = 2, 8 and 64; the bytes differ by the per-micro-batch
    offsets (a few bytes per micro-batch and tower)."""
    sizes = {k: _size(_build(num_towers, k, batch=128)[0]) for k in (2, 8, 64)}
    assert sizes[2][0] == sizes[8][0] == sizes[64][0], sizes
    assert sizes[64][1] - sizes[2][1] <= 16 * 62 * num_towers, sizes


def test_an_input_function_is_called_once_per_micro_batch_and_tower_only():
    """What grows with k is the input function's calls (B must be known before the loop)."""
    calls = {}

    def sizes_for(k):
        with tf.Graph().as_default() as graph:
            rng = np.random.RandomState(0)
            data = (rng.randn(4, 4).astype(np.float32), rng.randn(4, 1).astype(np.float32))

            def input_fn(ctx):
                calls[k] = calls.get(k, 0) + 1
                return tuple(tf.constant(x) for x in data)

            towerlib.build_train_graph(
                dense_tanh_dense, input_fn, tf.compat.v1.train.GradientDescentOptimizer(0.1),
                num_towers=2, accumulation_steps=k)
        return _size(graph)[0]

    small, large = sizes_for(2), sizes_for(6)
    assert calls == {2: 4, 6: 12}
    assert large - small < 4 * 8 * 2, (small, large)  # a constant and a slice per call


_FIRST_STEP = textwrap.dedent("""
    import numpy as np
    import tensorflow as tf
    import towerlib
    from tests.step.test_accumulation_graph import dense_tanh_dense
    for towers, k in [(1, 2), (1, 4), (2, 2)]:
        with tf.Graph().as_default():
            rng = np.random.RandomState(0)
            batch = tf.compat.v1.data.make_one_shot_iterator(
                tf.data.Dataset.from_tensor_slices((
                    rng.randn(64, 4).astype(np.float32),
                    rng.randn(64, 1).astype(np.float32))).repeat().batch(8)).get_next()
            train = towerlib.build_train_graph(
                dense_tanh_dense, batch, tf.compat.v1.train.GradientDescentOptimizer(0.1),
                num_towers=towers, accumulation_steps=k)
            with tf.compat.v1.Session(config=towerlib.session_config(towers)) as session:
                train.initialize(session)
                session.run(train.train_op)
                print("stepped", towers, k, flush=True)
""")


@pytest.mark.slow  # a fresh Python, to read TensorFlow's C++ log
def test_first_step_logs_no_failed_topological_sort():
    """Grappler's layout and dependency optimizers sort the step's graph."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0",
               PYTHONPATH=helpers.REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    run = subprocess.run([sys.executable, "-c", _FIRST_STEP], capture_output=True, text=True,
                         timeout=300, env=env, cwd=helpers.REPO_ROOT, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split("\n").count("stepped 1 2") == 1, run.stdout
    assert "stepped 2 2" in run.stdout, run.stdout
    # The C++ log is on: what grappler would have said is in stderr.
    assert re.search(r"^[IWE]\d{4} ", run.stderr, re.M), run.stderr[-2000:]
    failures = [line for line in run.stderr.splitlines()
                if any(failure in line for failure in SORT_FAILURES)]
    assert not failures, failures


def test_the_bodys_buffer_handles_name_the_outer_buffers():
    """The body names each step-local buffer by a handle op of its own: same resource
    (shared name, container), device, dtype and shape as the outer one; none captured."""
    graph, train = _build(2, 2)
    graph_def = graph.as_graph_def()
    outer = {node.attr["shared_name"].s: node for node in graph_def.node
             if node.op == "VarHandleOp" and node.attr["shared_name"].s.startswith(b"accumulation/")}
    inner = [node for function in graph_def.library.function for node in function.node_def
             if node.op == "VarHandleOp"]
    assert len(outer) == len(train.accumulation_buffers) and inner
    assert {node.attr["shared_name"].s for node in inner} == set(outer)
    for node in inner:
        twin = outer[node.attr["shared_name"].s]
        assert node.device == twin.device != ""
        for attr in ("container", "dtype", "shape"):
            assert node.attr[attr] == twin.attr[attr], (node.name, attr)
    loop = [node for node in graph_def.node if node.op == "While"][0]
    captured = {name.split(":")[0].lstrip("^") for name in loop.input}
    assert not captured & {node.name for node in outer.values()}

"""The graph accumulation builds: micro-batches chained by control edges (issue 22 item 18).

Micro-batch j's inputs wait on a gate (a NoOp) that waits on micro-batch
j - 1's gradients and on micro-batch j - 1's gate. The tests check that
the chain keeps every earlier micro-batch's gradients ahead of a
micro-batch's inputs, that its control edges grow linearly with k (they
grew as k^2 when every input waited on every earlier gradient), that the
GraphDef sorts topologically, and that TensorFlow's graph optimizer logs no
failed topological sort on the first step.
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
from towerlib.step import accumulation

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


def _control_edges(graph_def):
    return sum(name.startswith("^") for node in graph_def.node for name in node.input)


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


def _ancestors(op):
    seen, stack = set(), [op]
    while stack:
        current = stack.pop()
        for parent in [t.op for t in current.inputs] + list(current.control_inputs):
            if parent.name not in seen:
                seen.add(parent.name)
                stack.append(parent)
    return seen


@pytest.mark.parametrize("num_towers,accumulation_steps", [(1, 2), (1, 4), (2, 3)])
def test_graph_sorts_topologically(num_towers, accumulation_steps):
    graph, _ = _build(num_towers, accumulation_steps)
    assert _unsorted_nodes(graph.as_graph_def()) == []


@pytest.mark.parametrize("num_towers", [1, 2])
def test_control_edges_grow_linearly_with_the_micro_batches(num_towers):
    """Issue 22 item 18: a micro-batch waits on the previous one only (was every earlier one)."""
    edges = {k: _control_edges(_build(num_towers, k)[0].as_graph_def()) for k in (2, 3, 4, 8)}
    step = edges[3] - edges[2]
    assert edges[4] - edges[3] == step, edges
    assert edges[8] - edges[4] == 4 * step, edges


def test_every_earlier_micro_batch_finishes_before_a_micro_batch_starts():
    """The chain is transitive: micro-batch j's gate follows every gradient op of micro-batches < j."""
    num_towers, k = 2, 4
    graph, train = _build(num_towers, k)
    needed = _ancestors(train.train_op)  # the ops the step runs
    for j in range(1, k):
        gate = graph.get_operation_by_name(f"micro_batch_{j}/wait_for_gradients")
        before = _ancestors(gate)
        for i in range(j):
            gradients = [op.name for op in graph.get_operations()
                         if op.name in needed and op.name.startswith(f"micro_batch_{i}/tower_")
                         and "/gradients/" in op.name]
            assert gradients, i
            assert set(gradients) <= before, (i, j, sorted(set(gradients) - before)[:5])
        for tower in range(num_towers):
            first = graph.get_operation_by_name(f"micro_batch_{j}/tower_{tower}/d1/MatMul")
            assert gate.name in _ancestors(first), (j, tower)
    # Each gate has one control input per gradient op of the previous micro-batch, plus the
    # previous gate; each of the micro-batch's inputs has one: the gate.
    for j in range(2, k):
        gate = graph.get_operation_by_name(f"micro_batch_{j}/wait_for_gradients")
        inputs = [op.name for op in gate.control_inputs]
        assert f"micro_batch_{j - 1}/wait_for_gradients" in inputs
        assert all(name.startswith(f"micro_batch_{j - 1}/") for name in inputs), inputs
        waiting = [op for op in graph.get_operations()
                   if gate in op.control_inputs and op.type != "NoOp"]  # the next gate
        assert waiting and all(op.type == "Identity" and len(op.control_inputs) == 1
                               for op in waiting), waiting


def test_after_chains_to_the_previous_gate_and_starts_anew_for_other_gradients():
    with tf.Graph().as_default():
        x = tf.constant(1.0)
        first = [tf.identity(x, name=f"g0_{i}") for i in range(3)]
        second = [tf.identity(x, name=f"g1_{i}") for i in range(3)]
        other = [tf.identity(x, name=f"h0_{i}") for i in range(2)]
        assert accumulation.after(x, [], "/device:CPU:0") is x
        gate_1 = accumulation.after(x, first, "/device:CPU:0").op.control_inputs[0]
        assert sorted(op.name for op in gate_1.control_inputs) == ["g0_0", "g0_1", "g0_2"]
        # Every earlier micro-batch's gradients, as build_train_graph passes them.
        gate_2 = accumulation.after(x, first + second, "/device:CPU:0").op.control_inputs[0]
        assert sorted(op.name for op in gate_2.control_inputs) == [
            "g1_0", "g1_1", "g1_2", gate_1.name]
        # Gradients the previous gate does not fall within: a new chain.
        gate_3 = accumulation.after(x, other, "/device:CPU:0").op.control_inputs[0]
        assert sorted(op.name for op in gate_3.control_inputs) == ["h0_0", "h0_1"]
        # An input function is gated when called; a nest keeps its structure.
        gated = accumulation.after(lambda ctx: {"a": x, "b": (x, x)}, second, "/device:CPU:0")
        nest = gated(None)
        assert set(nest) == {"a", "b"} and len(nest["b"]) == 2
        assert all(len(t.op.control_inputs) == 1 for t in tf.nest.flatten(nest))


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
    """Issue 22 item 18: grappler's layout and dependency optimizers sort the step's graph."""
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

"""Building one worker's step of an all-reduce job (no server needed: nothing runs).

The processes themselves are in tests/cluster/test_allreduce_*.py; here the
built graph: one collective group over every worker's towers, the rules that
refuse what cannot span workers, and the resume-step choice.
"""

import numpy as np
import pytest
import tensorflow as tf

import towerlib
from towerlib.cluster import agreement
from towerlib.cluster.allreduce_job import choose_resume_step
from towerlib.exchange import safety
from towerlib.exchange.reducer import CrossTowerReducer
from towerlib.internals import collective_ops
from towerlib.step import across_workers


def test_worker_group_maps_local_towers_to_members():
    group = towerlib.WorkerGroup(num_workers=3, worker_index=2)
    assert group.spans_workers and not group.is_chief
    assert group.size(towers_per_worker=2) == 6
    assert [group.member(i, 2) for i in range(2)] == [4, 5]
    with pytest.raises(ValueError, match=r"outside 0\.\.2"):
        towerlib.WorkerGroup(num_workers=3, worker_index=3)
    with pytest.raises(TypeError, match="must be an int"):
        towerlib.WorkerGroup(num_workers=2.0)


def model(inputs, ctx):
    weights = tf.compat.v1.get_variable("w", [3, 2])
    hidden = towerlib.batch_norm(tf.matmul(inputs, weights), ctx, name="bn")
    return tf.reduce_mean(tf.square(hidden))


def build_worker(worker_index, bn_mode="sync", batch=None, **options):
    devices = [f"/job:worker/replica:0/task:{worker_index}/device:CPU:{i}" for i in range(2)]
    return towerlib.build_train_graph(
        model, tf.zeros([8, 3]) if batch is None else batch,
        tf.compat.v1.train.GradientDescentOptimizer(0.1),
        devices=devices, bn_mode=bn_mode, update=towerlib.Replicated(),
        workers=towerlib.WorkerGroup(num_workers=2, worker_index=worker_index), **options)


@pytest.mark.parametrize("bn_mode", ["first_tower", "all_towers", "sync"])
def test_every_collective_spans_every_workers_towers(bn_mode):
    with tf.Graph().as_default() as graph:
        train = build_worker(1, bn_mode)
        collectives = [op for op in graph.get_operations()
                       if collective_ops.is_collective_op(op)]
        assert collectives
        assert {op.get_attr("group_size") for op in collectives} == {4}
        # Only this worker's two members are in its graph, one per tower device.
        assert {op.device.split("device:")[-1] for op in collectives} == {"CPU:0", "CPU:1"}
        assert all("/task:1/" in op.device for op in collectives)
        assert train.broadcast_op is not None
        # The train op runs this worker's half of every collective it needs.
        safety.check_fetches(train.train_op, graph=graph)
        safety.check_fetches(train.loss, graph=graph)


def test_one_tower_per_worker_still_synchronizes_batch_norm():
    """3 x 1: no local peer, yet sync batch norm gathers over the 3 workers."""
    with tf.Graph().as_default() as graph:
        towerlib.build_train_graph(
            model, tf.zeros([8, 3]), tf.compat.v1.train.GradientDescentOptimizer(0.1),
            devices=["/job:worker/replica:0/task:2/device:CPU:0"], bn_mode="sync",
            update=towerlib.Replicated(), workers=towerlib.WorkerGroup(3, 2))
        names = [op.name for op in graph.get_operations()
                 if collective_ops.is_collective_op(op)]
        assert any("sync_batch_norm" in name for name in names), names


def test_what_cannot_span_workers_is_refused_before_building():
    with tf.Graph().as_default():
        with pytest.raises(ValueError, match=r"cannot span the 2 workers.*CollectiveExchange"):
            build_worker(0, exchange="graph")
        with pytest.raises(ValueError, match=r"towerlib.Replicated\(\)"):
            towerlib.build_train_graph(
                model, tf.zeros([8, 3]), tf.compat.v1.train.GradientDescentOptimizer(0.1),
                num_towers=1, update="parameter_server",
                workers=towerlib.WorkerGroup(num_workers=2, worker_index=0))


def test_only_the_chief_adds_the_weights_regularization():
    """Summed over workers, a weight's regularization counts once."""
    def regularized(inputs, ctx):
        weights = tf.compat.v1.get_variable(
            "w", [3, 2], regularizer=lambda w: 0.5 * tf.reduce_sum(w))
        return tf.reduce_mean(tf.matmul(inputs, weights))

    def objective_reads_regularization(worker_index):
        with tf.Graph().as_default() as graph:
            towerlib.build_train_graph(
                regularized, tf.zeros([4, 3]), tf.compat.v1.train.GradientDescentOptimizer(0.1),
                devices=[f"/job:worker/replica:0/task:{worker_index}/device:CPU:0"],
                update=towerlib.Replicated(), workers=towerlib.WorkerGroup(2, worker_index))
            return any(op.name.endswith("tower_0/regularization")
                       for op in graph.get_operations())

    assert objective_reads_regularization(0)
    assert not objective_reads_regularization(1)


@pytest.mark.parametrize("steps, expected", [
    ([[10, 20], [10, 20]], 20),
    ([[10, 20], [10]], 10),
    ([[10, 20], []], 20),
    ([[], [10]], None),
    ([[5, 10, 15], [10, 15], [5, 10]], 10),
])
def test_resume_step_is_the_newest_every_worker_has(steps, expected):
    assert choose_resume_step(steps) == expected


@pytest.mark.parametrize("steps, expected", [
    ([[10, 20], [10]], 20),      # a worker whose folder is older (it was removed a while)
    ([[10, 20], []], 20),        # a worker new to the job
    ([[], [10]], None),
])
def test_resume_step_is_the_chiefs_newest_when_the_chief_carries_the_input_position(
        steps, expected):
    assert choose_resume_step(steps, chief_decides=True) == expected


def test_float16_with_batch_norm_builds_across_workers():
    """The moving statistics' exchange is built outside float16's skip (a tf.cond):
    every worker runs it whether or not the step applies."""
    for bn_mode in ("first_tower", "all_towers", "sync"):
        with tf.Graph().as_default():
            build_worker(1, bn_mode, precision=towerlib.Float16())


def test_the_broadcast_runs_no_step_on_gpus():
    """With NCCL each GPU's collectives are chained in creation order; the broadcast,
    built last and run alone at start, starts a chain of its own, so running it
    pulls no batch and computes no forward or backward pass."""
    with tf.Graph().as_default():
        devices = [f"/job:worker/replica:0/task:0/device:GPU:{i}" for i in range(2)]
        batch = tf.compat.v1.data.make_one_shot_iterator(
            tf.data.Dataset.from_tensors(tf.zeros([8, 3])).repeat()).get_next()
        train = towerlib.build_train_graph(
            model, batch, tf.compat.v1.train.GradientDescentOptimizer(0.1), devices=devices,
            bn_mode="sync", update=towerlib.Replicated(),
            workers=towerlib.WorkerGroup(num_workers=2, worker_index=0))
        needed, stack = set(), [train.broadcast_op]
        while stack:
            op = stack.pop()
            if op.name in needed:
                continue
            needed.add(op.name)
            stack.extend(t.op for t in op.inputs)
            stack.extend(op.control_inputs)
        graph = tf.compat.v1.get_default_graph()
        types = {graph.get_operation_by_name(name).type for name in needed}
        assert "IteratorGetNext" not in types and "MatMul" not in types, sorted(types)
        assert any(name.startswith("broadcast_from_chief") for name in needed)


def closure_names(fetch):
    """The names of every op running `fetch` needs."""
    needed, stack = set(), [fetch if isinstance(fetch, tf.Operation) else fetch.op]
    while stack:
        op = stack.pop()
        if op.name not in needed:
            needed.add(op.name)
            stack.extend(t.op for t in op.inputs)
            stack.extend(op.control_inputs)
    return needed


def example_count_collectives(names):
    graph = tf.compat.v1.get_default_graph()
    return sorted(name for name in names if "examples" in name
                  and collective_ops.is_collective_op(graph.get_operation_by_name(name)))


@pytest.mark.parametrize("accumulation_steps", [1, 2])
def test_static_batch_sizes_are_counted_once_at_start_not_every_step(accumulation_steps):
    """The global batch B of n_i / B cannot change when every batch size is static: its
    exchange runs with the broadcast, and the step reads the total from a variable."""
    with tf.Graph().as_default():
        train = build_worker(1, "first_tower", accumulation_steps=accumulation_steps)
        assert example_count_collectives(closure_names(train.train_op)) == []
        assert example_count_collectives(closure_names(train.broadcast_op))
        description = describe(train)
    with tf.Graph().as_default():
        batch = tf.compat.v1.placeholder(tf.float32, [None, 3])
        train = build_worker(1, "first_tower", batch=batch,
                             accumulation_steps=accumulation_steps)
        assert example_count_collectives(closure_names(train.train_op))
        assert example_count_collectives(closure_names(train.broadcast_op)) == []
        dynamic = describe(train)
    # Workers that would differ here would wait for each other's collectives: refused.
    assert agreement.first_difference([description, dynamic]) == (
        1, "examples per step", dynamic["examples per step"],
        "static, exchanged once at start")


def describe(train):
    return agreement.describe_step(train, tf.compat.v1.train.GradientDescentOptimizer(0.1), {})


def test_a_step_run_before_the_start_op_shows_nan_not_a_wrong_loss():
    """One worker alone (a group of 1 has nothing to exchange): the fixed total is
    NaN until the start op sets it, then the worker's own count."""
    with tf.Graph().as_default():
        sums = across_workers.WorkerSums(CrossTowerReducer(
            ["/device:CPU:0"], transport="collective",
            workers=towerlib.WorkerGroup(num_workers=1, worker_index=0)))
        [total] = sums.fixed([8.0], "tower_examples")
        start = sums.start_op()
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.local_variables_initializer())
            assert np.isnan(session.run(total))
            session.run(start)
            assert session.run(total) == 8.0
        with pytest.raises(TypeError, match="finite Python numbers"):
            sums.fixed([tf.constant(8.0)], "tower_examples")


@pytest.mark.parametrize("bn_mode, alone", [
    ("first_tower", []), ("sync", []), ("all_towers", ["moving_statistics"])])
def test_the_losses_and_moving_statistics_cross_with_the_gradients(bn_mode, alone):
    """Between workers a step exchanges the gradients, and in their first buffer the
    global losses and the chief's moving statistics ('all_towers' gathers every
    tower's statistics alone); sync batch norm's own exchanges are the layer's."""
    with tf.Graph().as_default() as graph:
        train = build_worker(1, bn_mode)
        crossing = [name for name in closure_names(train.train_op)
                    if collective_ops.is_collective_op(graph.get_operation_by_name(name))
                    and "sync_batch_norm" not in name]
        others = [name for name in crossing if not name.startswith("allreduce_gradients/")]
        # One op per local tower for each exchange of its own.
        assert all(any(part in name for part in alone) for name in others), crossing
        assert [part for part in alone if any(part in name for name in others)] == alone
        assert any(name.startswith("allreduce_gradients/") for name in crossing)
        assert any(op.name.startswith("worker_riders") for op in graph.get_operations())

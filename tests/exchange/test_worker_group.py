"""Building one worker's step of an all-reduce job (no server needed: nothing runs).

The processes themselves are in tests/cluster/test_allreduce_*.py; here the
built graph: the exchanges over every worker's towers, the rules that
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
def test_cpu_towers_meet_in_a_hub_then_in_one_collective_between_workers(bn_mode):
    """A worker's CPU towers exchange through graph edges; only the hub's output
    crosses to the other workers: a collective group of W members, not W x N."""
    with tf.Graph().as_default() as graph:
        train = build_worker(1, bn_mode)
        collectives = [op for op in graph.get_operations()
                       if collective_ops.is_collective_op(op)]
        assert collectives
        assert {op.get_attr("group_size") for op in collectives} == {2}
        # One member per worker: this worker's first tower device.
        assert {op.device for op in collectives} == {
            "/job:worker/replica:0/task:1/device:CPU:0"}
        hubs = {op.type for op in graph.get_operations()
                if op.name.startswith("cross_tower_exchange")}
        assert "ConcatV2" in hubs  # small sums gather rows too
        assert train.broadcast_op is not None
        # The train op runs this worker's half of every collective it needs.
        safety.check_fetches(train.train_op, graph=graph)
        safety.check_fetches(train.loss, graph=graph)


def test_a_sum_through_worker_hubs_adds_member_rows_as_one_process_adds():
    """Every tower's vector is gathered as a row, and one AddN adds the W x N rows
    in member order: one process's graph hub adds the same rows with the same op.
    A sum in two levels (the worker's AddN, then an all-reduce) rounds
    differently, and a ReLU input within rounding of 0 then flips a gradient."""
    with tf.Graph().as_default():
        devices = [f"/job:worker/replica:0/task:1/device:CPU:{i}" for i in range(2)]
        reducer = CrossTowerReducer(
            devices, transport="collective",
            workers=towerlib.WorkerGroup(num_workers=2, worker_index=1))
        sums = []
        for tower, device in enumerate(devices):
            with tf.device(device):
                sums.append(reducer.sum([tf.fill([5], float(tower + 1))], tower,
                                        name="small", differentiable=False)[0])
        assert sums[0] is sums[1]  # one result every tower reads
        added = sums[0].op
        while added.type != "AddN":  # through the reducer's unpacking
            assert added.inputs, f"no AddN above {sums[0].op.name}"
            added = added.inputs[0].op
        assert len(added.inputs) == 4  # W x N rows, not a hub's N then W
        unstacked = added.inputs[0].op
        assert unstacked.type == "Unpack"
        assert [t.value_index for t in added.inputs] == [0, 1, 2, 3]  # member order
        gathered = unstacked.inputs[0].op
        assert gathered.type == "CollectiveGather"
        assert gathered.get_attr("group_size") == 2  # one member per worker
        assert added.device == gathered.device == devices[0]
        assert gathered.inputs[0].op.inputs[0].op.type == "ConcatV2"  # the worker's rows


def test_beyond_four_towers_a_gradient_buffer_is_summed_per_worker_then_all_reduced():
    """3 workers x 2 towers: a gather would bring each worker 4 copies of a large
    buffer, so it is the worker's AddN, then an all-reduce of 3 members; a small
    vector (batch-norm statistics) is still gathered and added as one process."""
    with tf.Graph().as_default() as graph:
        devices = [f"/job:worker/replica:0/task:2/device:CPU:{i}" for i in range(2)]
        reducer = CrossTowerReducer(
            devices, transport="collective",
            workers=towerlib.WorkerGroup(num_workers=3, worker_index=2))
        for tower, device in enumerate(devices):
            with tf.device(device):
                reducer.sum([tf.zeros([30000])], tower, name="large", differentiable=False)
                reducer.sum([tf.zeros([8])], tower, name="small", differentiable=False)
        collectives = {op.type: op for op in graph.get_operations()
                       if collective_ops.is_collective_op(op)}
        assert set(collectives) == {"CollectiveReduce", "CollectiveGather"}
        assert {op.get_attr("group_size") for op in collectives.values()} == {3}
        assert collectives["CollectiveReduce"].inputs[0].op.inputs[0].op.type == "AddN"
        added = [op for op in graph.get_operations() if op.type == "AddN"]
        assert sorted(len(op.inputs) for op in added) == [2, 6]  # worker's 2; 6 rows


def test_a_bfloat16_sum_crosses_between_workers_as_float32():
    """CollectiveGather has no bfloat16 kernel: wire_dtype=bfloat16 gradients cross
    as float32 (exact both ways) and are added in bfloat16, as one process adds."""
    with tf.Graph().as_default() as graph:
        devices = [f"/job:worker/replica:0/task:1/device:CPU:{i}" for i in range(2)]
        reducer = CrossTowerReducer(
            devices, transport="collective",
            workers=towerlib.WorkerGroup(num_workers=2, worker_index=1))
        sums = [reducer.sum([tf.zeros([30000], tf.bfloat16)], tower, name="gradients",
                            differentiable=False)[0] for tower in range(2)]
        assert sums[0].dtype == tf.bfloat16
        (gathered,) = [op for op in graph.get_operations() if op.type == "CollectiveGather"]
        assert gathered.get_attr("T") == tf.float32


def test_bare_tower_devices_put_the_exchange_between_workers_on_this_task():
    """Device names without a job and task take them from the enclosing scope, for
    the collective between the workers too (its context is cleared of scopes)."""
    with tf.Graph().as_default() as graph, tf.device("/job:worker/replica:0/task:1"):
        devices = ["/device:CPU:0", "/device:CPU:1"]
        reducer = CrossTowerReducer(
            devices, transport="collective",
            workers=towerlib.WorkerGroup(num_workers=2, worker_index=1))
        for tower, device in enumerate(devices):
            with tf.device(device):
                reducer.sum([tf.fill([5], 1.0)], tower, name="small", differentiable=False)
        placed = {op.device for op in graph.get_operations()
                  if collective_ops.is_collective_op(op) or op.type == "AddN"}
        assert placed == {"/job:worker/replica:0/task:1/device:CPU:0"}


def test_gpu_towers_join_one_collective_group_of_every_workers_towers():
    """Between GPUs NCCL picks its own topology: every tower is a member."""
    with tf.Graph().as_default() as graph:
        devices = [f"/job:worker/replica:0/task:1/device:GPU:{i}" for i in range(2)]
        towerlib.build_train_graph(
            model, tf.zeros([8, 3]), tf.compat.v1.train.GradientDescentOptimizer(0.1),
            devices=devices, bn_mode="sync", update=towerlib.Replicated(),
            workers=towerlib.WorkerGroup(num_workers=2, worker_index=1))
        collectives = [op for op in graph.get_operations()
                       if collective_ops.is_collective_op(op)]
        assert {op.get_attr("group_size") for op in collectives} == {4}
        assert {op.device.split("device:")[-1] for op in collectives} == {"GPU:0", "GPU:1"}


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


def test_the_lost_workers_message_names_the_checkpoint_the_restart_resumes_from():
    """With every input's position in the chief's broadcast (global_batch_input) the
    restart resumes from the chief's newest checkpoint, not the newest all workers have."""
    from tests.distributed_processes import free_ports
    from towerlib import cluster as cluster_lib
    from towerlib.cluster.allreduce_job import _lost_message
    ports = free_ports(2)  # nobody listens: worker 1 is gone
    cluster = cluster_lib.cluster_from_flags(
        worker_hosts=f"127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}", job_name="worker",
        task_index=0)
    broadcast = _lost_message(cluster, 5, "its run 3 could not complete", True)
    own = _lost_message(cluster, 5, "its run 3 could not complete", False)
    assert "resume from the chief's newest checkpoint" in broadcast
    assert "all of them have" not in broadcast
    assert "resume from the newest checkpoint all of them have" in own


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
        # Besides the gradients, only the exchanges of their own named here.
        assert all(any(part in name for part in alone) for name in others), crossing
        assert [part for part in alone if any(part in name for name in others)] == alone
        assert any(name.startswith("allreduce_gradients/") for name in crossing)
        assert any(op.name.startswith("worker_riders") for op in graph.get_operations())


def test_numpy_bools_describe_a_step_as_python_bools_do():
    # A worker that passed summaries=np.True_ and one that passed True agree.
    assert agreement._value_text(np.True_) == agreement._value_text(True) == "True"
    assert agreement._value_text(np.False_) == "False"


def test_keep_best_is_agreed_only_when_every_save_is_an_exchange():
    """With the slots sharded over the workers the best checkpoint's save gathers them
    from every worker: a worker keeping no best would leave the others waiting in it,
    so keep_best must agree. Unsharded, each worker's best is its own (keep_best on the
    chief only is fine)."""
    from types import SimpleNamespace
    def loop(keep_best):
        evaluation = SimpleNamespace(every_n_steps=5, metric="xent", higher_is_better=False,
                                     patience=0, min_delta=0.0, num_batches=1,
                                     keep_best=keep_best)
        return {"evaluation": evaluation, "save_checkpoint_steps": 10}
    chief, worker = loop(True), loop(False)
    assert agreement.first_difference([agreement.describe_loop(20, chief),
                                       agreement.describe_loop(20, worker)]) is None
    assert agreement.first_difference([
        agreement.describe_loop(20, chief, saves_together=True),
        agreement.describe_loop(20, worker, saves_together=True)]) == (
            1, "evaluation keep_best", "False", "True")

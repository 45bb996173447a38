"""Tests for towerlib.exchange on virtual CPU devices (no GPU needed)."""

import textwrap

import numpy as np
import pytest
import tensorflow as tf

from tests import helpers
from towerlib.exchange import (
    CollectiveMismatchError,
    CrossTowerReducer,
    PartialFetchError,
    check_fetches,
)
from towerlib.run.hooks import CollectiveFetchCheckHook

COLLECTIVE_TYPES = ("CollectiveReduce", "CollectiveGather")
# What a reduction computes must not depend on how the towers exchange it.
TRANSPORTS = ["graph", "collective"]


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("num_towers", [2, 3, 4])
def test_sum_and_gather_forward_are_exact(num_towers, transport):
    rng = np.random.default_rng(num_towers)
    vectors = [rng.normal(size=[5]).astype(np.float32) for _ in range(num_towers)]
    matrices = [rng.normal(size=[2, 3]).astype(np.float32) for _ in range(num_towers)]
    graph = tf.Graph()
    with graph.as_default():
        reducer = CrossTowerReducer(helpers.cpu_devices(num_towers), timeout_seconds=30,
                                    transport=transport)
        sums, gathers = [], []
        for i in range(num_towers):
            with tf.device(f"/device:CPU:{i}"):
                sums.append(reducer.sum([vectors[i], matrices[i]], i, name="stats"))
                gathers.append(reducer.gather(vectors[i], i, name="rows"))
        reducer.check_consistent()
        with helpers.cpu_session(graph, num_towers) as sess:
            got_sums, got_gathers = sess.run([sums, gathers])
    for tower_sum, tower_gather in zip(got_sums, got_gathers):
        np.testing.assert_allclose(tower_sum[0], np.sum(vectors, 0), rtol=1e-6)
        np.testing.assert_allclose(tower_sum[1], np.sum(matrices, 0), rtol=1e-6)
        np.testing.assert_array_equal(tower_gather, np.stack(vectors))
    assert sums[0][1].shape.as_list() == [2, 3]
    assert gathers[0].shape.as_list() == [num_towers, 5]


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("num_towers", [2, 3, 4])
def test_gradients_through_sum_and_gather_are_exact(num_towers, transport):
    """Each tower differentiates its own loss, as a tower builder does.

    Tower t: s = sum_u x_u (all-reduce), G = [x_0; ...] (all-gather),
    L_t = c_t * sum(s**2) + d_t * sum(G**2 * W). The data-parallel gradient
    for x_i is d(sum_t L_t)/dx_i = 2 s sum_t c_t + 2 x_i W[i] sum_t d_t.
    """
    rng = np.random.default_rng(7 + num_towers)
    xs = [rng.normal(size=[4]) for _ in range(num_towers)]
    c = rng.uniform(0.5, 2.0, size=num_towers)
    d = rng.uniform(0.5, 2.0, size=num_towers)
    weights = rng.normal(size=[num_towers, 4])
    graph = tf.Graph()
    with graph.as_default():
        reducer = CrossTowerReducer(helpers.cpu_devices(num_towers), timeout_seconds=30,
                                    transport=transport)
        grads = []
        for i in range(num_towers):
            with tf.device(f"/device:CPU:{i}"):
                x = tf.constant(xs[i], tf.float64)
                s = reducer.sum(x, i, name="s")
                g = reducer.gather(x, i, name="g")
                loss = c[i] * tf.reduce_sum(s * s) + d[i] * tf.reduce_sum(g * g * weights)
                grads.append(tf.gradients(loss, x)[0])
        reducer.check_consistent()
        with helpers.cpu_session(graph, num_towers) as sess:
            got = sess.run(grads)
    s = np.sum(xs, axis=0)
    for i in range(num_towers):
        want = 2 * s * c.sum() + 2 * xs[i] * weights[i] * d.sum()
        np.testing.assert_allclose(got[i], want, rtol=1e-12)


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("tower_devices", [[2, 0, 1], [1, 2, 0], [3, 2, 1, 0]])
def test_gather_rows_and_gradients_follow_tower_order_not_device_order(tower_devices, transport):
    """Collective ranks follow the devices (sorted names on CPU, the
    interconnect on GPUs), not the order the towers list them in."""
    num_towers = len(tower_devices)
    devices = [f"/device:CPU:{d}" for d in tower_devices]
    rng = np.random.default_rng(num_towers)
    xs = [rng.normal(size=[3]) for _ in range(num_towers)]
    weights = rng.normal(size=[num_towers, 3])
    graph = tf.Graph()
    with graph.as_default():
        reducer = CrossTowerReducer(devices, timeout_seconds=30, transport=transport)
        gathers, unordered, grads = [], [], []
        for i, device in enumerate(devices):
            with tf.device(device):
                x = tf.constant(xs[i], tf.float64)
                g = reducer.gather(x, i, name="g")
                unordered.append(reducer.gather_unordered(x, i, name="u"))
                gathers.append(g)
                grads.append(tf.gradients((i + 1.0) * tf.reduce_sum(g * g * weights), x)[0])
        reducer.check_consistent()
        with helpers.cpu_session(graph, num_towers) as sess:
            got_gathers, got_unordered, got_grads = sess.run([gathers, unordered, grads])
    total_scale = sum(range(1, num_towers + 1))
    for i in range(num_towers):
        np.testing.assert_array_equal(got_gathers[i], np.stack(xs))
        np.testing.assert_allclose(got_grads[i], 2 * xs[i] * weights[i] * total_scale, rtol=1e-12)
        # The same rows in the same (rank) order on every tower.
        np.testing.assert_array_equal(got_unordered[i], got_unordered[0])
    assert sorted(map(tuple, got_unordered[0])) == sorted(map(tuple, np.stack(xs)))
    if transport == "collective":
        # The test has teeth: here the rank order is not the tower order.
        assert not np.array_equal(got_unordered[0], np.stack(xs))
    else:  # the hub concatenates in tower order
        np.testing.assert_array_equal(got_unordered[0], np.stack(xs))


@pytest.mark.parametrize("ordered", [False, True])
def test_ops_are_placed_on_tower_devices_and_keyed_per_call_order(ordered):
    graph = tf.Graph()
    with graph.as_default():
        reducer = CrossTowerReducer(helpers.cpu_devices(2), timeout_seconds=30, ordered=ordered,
                                    transport="collective")
        for i in range(2):
            x = tf.ones([3])
            y = reducer.sum(x, i, name="first")
            reducer.sum(y * 2.0, i, name="second")
    ops = [op for op in graph.get_operations() if op.type in COLLECTIVE_TYPES]
    assert len(ops) == 4
    by_tower = {}
    for op in ops:
        by_tower.setdefault(op.device, []).append(op)
    assert sorted(by_tower) == ["/device:CPU:0", "/device:CPU:1"]
    for tower_ops in by_tower.values():
        first, second = tower_ops
        assert first.get_attr("communication_hint") == b"auto"
        assert first.get_attr("timeout_seconds") == 30.0
        assert first.get_attr("group_key") == reducer.group_key
        # Ordered: the same launch order on every device (what NCCL needs).
        assert (first in second.control_inputs) == ordered
    keys = [[op.get_attr("instance_key") for op in by_tower[d]] for d in sorted(by_tower)]
    assert keys[0] == keys[1]  # k-th call pairs with the k-th call
    assert keys[0][0] != keys[0][1]


def test_backward_uses_its_own_instance_keys():
    graph = tf.Graph()
    with graph.as_default():
        reducer = CrossTowerReducer(helpers.cpu_devices(2), timeout_seconds=30, transport="collective")
        for i in range(2):
            x = tf.ones([3])
            tf.gradients(tf.reduce_sum(reducer.sum(x, i) ** 2), x)
        reducer.check_consistent()
    keys = {}
    for op in graph.get_operations():
        if op.type in COLLECTIVE_TYPES:
            keys.setdefault(op.device, []).append(op.get_attr("instance_key"))
    forward0, backward0 = keys["/device:CPU:0"]
    assert keys["/device:CPU:1"] == [forward0, backward0]
    assert forward0 != backward0


def test_small_sums_gather_large_sums_all_reduce_both_exact():
    """Off NCCL a small sum is an all-gather plus a local add (half the ring
    steps); a large one stays an all-reduce. Both give the exact sum."""
    rng = np.random.default_rng(3)
    small = [rng.normal(size=[6]).astype(np.float32) for _ in range(3)]
    large = [rng.normal(size=[40000]).astype(np.float32) for _ in range(3)]
    with tf.Graph().as_default() as graph:
        reducer = CrossTowerReducer(helpers.cpu_devices(3), timeout_seconds=30, transport="collective")
        outs = [
            (reducer.sum(small[i], i, name="small"), reducer.sum(large[i], i, name="large"))
            for i in range(3)
        ]
        types = {
            name: {op.type for op in graph.get_operations() if op.name.startswith(name)}
            for name in ("small", "large")
        }
        with helpers.cpu_session(graph, 3) as sess:
            got = sess.run(outs)
    assert "CollectiveGather" in types["small"] and "CollectiveReduce" not in types["small"]
    assert "CollectiveReduce" in types["large"]
    for small_sum, large_sum in got:
        np.testing.assert_array_equal(small_sum, got[0][0])  # same bits on every tower
        np.testing.assert_allclose(small_sum, np.sum(small, 0), rtol=1e-6)
        np.testing.assert_allclose(large_sum, np.sum(large, 0), rtol=1e-5, atol=1e-6)


def test_gpu_devices_use_nccl():
    with tf.Graph().as_default() as graph:
        reducer = CrossTowerReducer(["/device:GPU:0", "/gpu:1"])
        for i in range(2):
            reducer.sum(tf.ones([2]), i)
    op = next(o for o in graph.get_operations() if o.type == "CollectiveReduce")
    assert reducer.transport == "collective"
    assert reducer.communication_hint == "nccl"
    assert reducer.ordered
    assert op.get_attr("communication_hint") == b"nccl"
    assert op.device == "/device:GPU:0"


def test_group_keys_unique_per_reducer_and_per_graph():
    with tf.Graph().as_default():
        a = CrossTowerReducer(helpers.cpu_devices(2), transport="collective")
        b = CrossTowerReducer(helpers.cpu_devices(2), transport="collective")
        assert a.group_key != b.group_key
        with pytest.raises(ValueError, match="already used"):
            CrossTowerReducer(helpers.cpu_devices(2), group_key=a.group_key, transport="collective")
    with tf.Graph().as_default():
        # A fresh graph starts afresh: nothing leaks from the previous graph.
        assert CrossTowerReducer(helpers.cpu_devices(2), transport="collective").group_key == a.group_key


def test_one_tower_builds_no_collective():
    with tf.Graph().as_default() as graph:
        reducer = CrossTowerReducer(["/device:CPU:0"])
        x = tf.constant([1.0, 2.0])
        s = reducer.sum(x, 0)
        g = reducer.gather(x, 0)
        grad = tf.gradients(tf.reduce_sum(s * g), x)[0]
        assert reducer.group_key is None
        assert not [o for o in graph.get_operations() if o.type.startswith("Collective")
                    or o.name.startswith("cross_tower_exchange")]
        with tf.compat.v1.Session() as sess:
            s_val, g_val, grad_val = sess.run([s, g, grad])
    np.testing.assert_array_equal(s_val, [1.0, 2.0])
    np.testing.assert_array_equal(g_val, [[1.0, 2.0]])
    np.testing.assert_array_equal(grad_val, [2.0, 4.0])


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_shape_mismatch_is_an_error_at_build_time_naming_the_tower(transport):
    with tf.Graph().as_default():
        reducer = CrossTowerReducer(helpers.cpu_devices(3), transport=transport)
        reducer.sum(tf.ones([4]), 0, name="conv1/bn")
        reducer.sum(tf.ones([4]), 1, name="conv1/bn")
        with pytest.raises(
            CollectiveMismatchError,
            match=r"tower 0 made sum 'conv1/bn'.*\[4\].*"
            r"tower 2 made sum 'conv2/bn'.*\[8\]",
        ):
            reducer.sum(tf.ones([8]), 2, name="conv2/bn")


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_call_count_mismatch_is_caught_by_check_consistent(transport):
    with tf.Graph().as_default():
        reducer = CrossTowerReducer(helpers.cpu_devices(2), transport=transport)
        for name in ("bn1", "bn2"):
            reducer.sum(tf.ones([4]), 0, name=name)
        reducer.sum(tf.ones([4]), 1, name="bn1")
        with pytest.raises(
            CollectiveMismatchError,
            match=r"tower 0: 2, tower 1: 1.*Tower 1 never made "
            r"reduction #1 \(sum 'bn2'",
        ):
            reducer.check_consistent()


def test_bad_arguments_fail_early_with_the_fix():
    with tf.Graph().as_default():
        with pytest.raises(ValueError, match="None .no per-op timeout. or a positive"):
            CrossTowerReducer(helpers.cpu_devices(2), timeout_seconds=0)
        with pytest.raises(ValueError, match="distinct"):
            CrossTowerReducer(["/device:CPU:0", "/cpu:0"])
        with pytest.raises(ValueError, match=r"transport must be one of \('collective', 'graph'\)"):
            CrossTowerReducer(helpers.cpu_devices(2), transport="nccl")
        reducer = CrossTowerReducer(helpers.cpu_devices(2))
        with pytest.raises(ValueError, match=r"tower_index must be an int in \[0, 2\)"):
            reducer.sum(tf.ones([2]), 2)
        with pytest.raises(ValueError, match="share a dtype"):
            reducer.sum([tf.ones([2]), tf.ones([2], tf.int32)], 0)
    with tf.Graph().as_default():
        with pytest.raises(ValueError, match="different graph"):
            reducer.sum(tf.ones([2]), 0)


def test_default_collectives_have_no_per_op_timeout():
    """TF starts a sleeping thread per op and step for a per-op timeout."""
    with tf.Graph().as_default() as graph:
        reducer = CrossTowerReducer(helpers.cpu_devices(2), transport="collective")
        for i in range(2):
            reducer.sum(tf.ones([2]), i)
    ops = [op for op in graph.get_operations() if op.type in COLLECTIVE_TYPES]
    assert reducer.timeout_seconds is None
    assert ops and all(op.get_attr("timeout_seconds") == 0.0 for op in ops)


def test_check_fetches_finds_a_partial_fetch_before_running():
    with tf.Graph().as_default() as graph:
        reducer = CrossTowerReducer(helpers.cpu_devices(3), transport="collective")
        inputs = [tf.constant([float(i)]) for i in range(3)]
        outs = [reducer.sum(x, i, name="bn1") * 2.0 for i, x in enumerate(inputs)]
        with pytest.raises(PartialFetchError, match=r"run 1 of the 3 ops.*bn1_cross_tower_sum"):
            check_fetches(outs[0])
        with pytest.raises(PartialFetchError, match="fetch the train op"):
            check_fetches({"a": outs[0], "b": outs[1].op.name})
        check_fetches(outs)  # every tower: fine
        check_fetches(tf.group(outs))  # through control inputs too
        # Feeding the collective's result cuts it out of the run.
        summed = outs[0].op.inputs[0]
        check_fetches(outs[0], feed_dict={summed: [1.0]})
        hook = CollectiveFetchCheckHook()
        with helpers.cpu_session(graph, 3) as sess:
            monitored = tf.compat.v1.train.MonitoredSession(
                session_creator=_ExistingSession(sess), hooks=[hook]
            )
            np.testing.assert_allclose(monitored.run(outs)[0], [6.0])
            with pytest.raises(PartialFetchError):
                monitored.run(outs[0])  # raised before anything runs


class _ExistingSession(tf.compat.v1.train.SessionCreator):
    def __init__(self, sess):
        self.sess = sess

    def create_session(self):
        return self.sess


# Runs that hang are bounded in a child process with a hard wall-clock bound,
# so a regression fails this test instead of hanging the suite (and a Session
# whose collectives were aborted stays out of this process). One child runs
# every case, each in its own Session, to pay for one TF import.
_PARTIAL_FETCH_SCRIPT = textwrap.dedent("""
    import time
    import tensorflow as tf
    from towerlib.exchange import (CrossTowerReducer, CollectiveTimeoutError,
                                     bounded_session_config,
                                     explain_collective_errors)
    for mode in ('op_timeout', 'run_options', 'session_deadline'):
      with tf.Graph().as_default() as graph:
        reducer = CrossTowerReducer(
            ['/device:CPU:0', '/device:CPU:1'],
            timeout_seconds=2.0 if mode == 'op_timeout' else None,
            transport='collective')
        outs = [reducer.sum(tf.ones([3]), i, name='bn1') for i in range(2)]
        config = tf.compat.v1.ConfigProto(device_count={'CPU': 2})
        if mode == 'session_deadline':
          config = bounded_session_config(config, timeout_seconds=1.5)
        with tf.compat.v1.Session(config=config) as sess:
          options = (tf.compat.v1.RunOptions(timeout_in_ms=1500)
                     if mode == 'run_options' else None)
          start = time.time()
          try:
            with explain_collective_errors():
              sess.run(outs[0], options=options)  # tower 0 only: no peer
            print(mode, 'NO_ERROR')
          except CollectiveTimeoutError as error:
            print(mode, 'ELAPSED', time.time() - start)
            print(mode, 'MESSAGE', error.message.replace('\\n', ' '))
          except tf.errors.OpError as error:
            print(mode, 'RAW', type(error).__name__,
                  error.message.replace('\\n', ' '))
""")


@pytest.mark.slow  # runs its script in a fresh process
def test_partial_fetch_run_ends_in_a_clear_error_not_a_hang():
    result = helpers.run_python_script(_PARTIAL_FETCH_SCRIPT)
    reports = {}
    for line in result.stdout.splitlines():
        mode, key, value = ([*line.split(" ", 2), "", ""])[:3]
        reports.setdefault(mode, {})[key] = value
    for mode in ("op_timeout", "run_options", "session_deadline"):
        report = reports.get(mode, {})
        assert "MESSAGE" in report, result.stdout + result.stderr[-3000:]
        assert float(report["ELAPSED"]) < 15.0
        message = report["MESSAGE"]
        assert "same session.run" in message  # says what went wrong
        assert "fetch the train op" in message  # and the fix
        assert "create a new Session" in message  # and the consequence
    message = reports["op_timeout"]["MESSAGE"]
    assert "bn1_cross_tower_sum" in message  # names the op that waited
    assert "Collective has timed out" in message
    for mode in ("run_options", "session_deadline"):
        assert "operation_timeout_in_ms" in reports[mode]["MESSAGE"]


def test_towerlib_collectives_are_recognized_by_group_key_not_by_name():
    from tensorflow.python.ops import collective_ops

    from towerlib.exchange import has_towerlib_collectives

    def foreign_collective():
        # Someone else's collective, named like towerlib's.
        with tf.name_scope("bn_cross_tower_gather"):
            collective_ops.all_gather(tf.ones([1]), 1, 1, 1)

    foreign = tf.Graph()
    with foreign.as_default():
        foreign_collective()
    assert not has_towerlib_collectives(foreign)

    unused = tf.Graph()
    with unused.as_default():
        CrossTowerReducer(helpers.cpu_devices(2), transport="collective")  # a reducer that never reduced...
        foreign_collective()  # ...next to a collective that is not its own
    assert not has_towerlib_collectives(unused)

    used = tf.Graph()
    with used.as_default():
        reducer = CrossTowerReducer(helpers.cpu_devices(2), transport="collective")
        for i in range(2):
            with tf.device(f"/device:CPU:{i}"):
                reducer.sum(tf.ones([2]), i, name="anything")
        meta_graph = tf.compat.v1.train.export_meta_graph()
    assert has_towerlib_collectives(used)

    imported = tf.Graph()  # no reducer here: only the ops' group keys remain
    with imported.as_default():
        tf.compat.v1.train.import_meta_graph(meta_graph)
    assert has_towerlib_collectives(imported)


def test_gather_and_gather_unordered_do_not_pair_with_each_other():
    with tf.Graph().as_default():
        reducer = CrossTowerReducer(helpers.cpu_devices(2))
        reducer.gather(tf.ones([3]), 0, name="rows")
        with pytest.raises(CollectiveMismatchError, match="gather_unordered 'rows'"):
            reducer.gather_unordered(tf.ones([3]), 1, name="rows")


def test_gather_refuses_more_towers_than_its_dtype_can_tag():
    with tf.Graph().as_default():
        reducer = CrossTowerReducer([f"/device:CPU:{i}" for i in range(257)],
                                    transport="collective")
        with pytest.raises(ValueError, match="bfloat16 holds integers exactly only up to 256"):
            reducer.gather(tf.ones([3], tf.bfloat16), 0, name="rows")
        reducer.gather(tf.ones([3], tf.float16), 0, name="ok")  # 257 <= 2048

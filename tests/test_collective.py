"""Tests for towerlib.collective on virtual CPU devices (no GPU needed)."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from towerlib.collective import CollectiveMismatchError, CrossTowerReducer

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


COLLECTIVE_TYPES = ("CollectiveReduce", "CollectiveGather")


def cpu_devices(n):
    return [f"/device:CPU:{i}" for i in range(n)]


def session(graph, n):
    config = tf.compat.v1.ConfigProto(device_count={"CPU": n})
    return tf.compat.v1.Session(graph=graph, config=config)


@pytest.mark.parametrize("num_towers", [2, 3, 4])
def test_sum_and_gather_forward_are_exact(num_towers):
    rng = np.random.default_rng(num_towers)
    vectors = [rng.normal(size=[5]).astype(np.float32) for _ in range(num_towers)]
    matrices = [rng.normal(size=[2, 3]).astype(np.float32) for _ in range(num_towers)]
    graph = tf.Graph()
    with graph.as_default():
        reducer = CrossTowerReducer(cpu_devices(num_towers), timeout_seconds=30)
        sums, gathers = [], []
        for i in range(num_towers):
            with tf.device(f"/device:CPU:{i}"):
                sums.append(reducer.sum([vectors[i], matrices[i]], i, name="stats"))
                gathers.append(reducer.gather(vectors[i], i, name="rows"))
        reducer.check_consistent()
        with session(graph, num_towers) as sess:
            got_sums, got_gathers = sess.run([sums, gathers])
    for tower_sum, tower_gather in zip(got_sums, got_gathers):
        np.testing.assert_allclose(tower_sum[0], np.sum(vectors, 0), rtol=1e-6)
        np.testing.assert_allclose(tower_sum[1], np.sum(matrices, 0), rtol=1e-6)
        np.testing.assert_array_equal(tower_gather, np.stack(vectors))
    assert sums[0][1].shape.as_list() == [2, 3]
    assert gathers[0].shape.as_list() == [num_towers, 5]


@pytest.mark.parametrize("num_towers", [2, 3, 4])
def test_gradients_through_sum_and_gather_are_exact(num_towers):
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
        reducer = CrossTowerReducer(cpu_devices(num_towers), timeout_seconds=30)
        grads = []
        for i in range(num_towers):
            with tf.device(f"/device:CPU:{i}"):
                x = tf.constant(xs[i], tf.float64)
                s = reducer.sum(x, i, name="s")
                g = reducer.gather(x, i, name="g")
                loss = c[i] * tf.reduce_sum(s * s) + d[i] * tf.reduce_sum(g * g * weights)
                grads.append(tf.gradients(loss, x)[0])
        reducer.check_consistent()
        with session(graph, num_towers) as sess:
            got = sess.run(grads)
    s = np.sum(xs, axis=0)
    for i in range(num_towers):
        want = 2 * s * c.sum() + 2 * xs[i] * weights[i] * d.sum()
        np.testing.assert_allclose(got[i], want, rtol=1e-12)


@pytest.mark.parametrize("ordered", [False, True])
def test_ops_are_placed_on_tower_devices_and_keyed_per_call_order(ordered):
    graph = tf.Graph()
    with graph.as_default():
        reducer = CrossTowerReducer(cpu_devices(2), timeout_seconds=30, ordered=ordered)
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
        reducer = CrossTowerReducer(cpu_devices(2), timeout_seconds=30)
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
        reducer = CrossTowerReducer(cpu_devices(3), timeout_seconds=30)
        outs = [
            (reducer.sum(small[i], i, name="small"), reducer.sum(large[i], i, name="large"))
            for i in range(3)
        ]
        types = {
            name: {op.type for op in graph.get_operations() if op.name.startswith(name)}
            for name in ("small", "large")
        }
        with session(graph, 3) as sess:
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
    assert reducer.communication_hint == "nccl"
    assert reducer.ordered
    assert op.get_attr("communication_hint") == b"nccl"
    assert op.device == "/device:GPU:0"


def test_group_keys_unique_per_reducer_and_per_graph():
    with tf.Graph().as_default():
        a = CrossTowerReducer(cpu_devices(2))
        b = CrossTowerReducer(cpu_devices(2))
        assert a.group_key != b.group_key
        with pytest.raises(ValueError, match="already used"):
            CrossTowerReducer(cpu_devices(2), group_key=a.group_key)
    with tf.Graph().as_default():
        # A fresh graph starts afresh: nothing leaks from the previous graph.
        assert CrossTowerReducer(cpu_devices(2)).group_key == a.group_key


def test_one_tower_builds_no_collective():
    with tf.Graph().as_default() as graph:
        reducer = CrossTowerReducer(["/device:CPU:0"])
        x = tf.constant([1.0, 2.0])
        s = reducer.sum(x, 0)
        g = reducer.gather(x, 0)
        grad = tf.gradients(tf.reduce_sum(s * g), x)[0]
        assert reducer.group_key is None
        assert not [o for o in graph.get_operations() if o.type.startswith("Collective")]
        with tf.compat.v1.Session() as sess:
            s_val, g_val, grad_val = sess.run([s, g, grad])
    np.testing.assert_array_equal(s_val, [1.0, 2.0])
    np.testing.assert_array_equal(g_val, [[1.0, 2.0]])
    np.testing.assert_array_equal(grad_val, [2.0, 4.0])


def test_shape_mismatch_is_an_error_at_build_time_naming_the_tower():
    with tf.Graph().as_default():
        reducer = CrossTowerReducer(cpu_devices(3))
        reducer.sum(tf.ones([4]), 0, name="conv1/bn")
        reducer.sum(tf.ones([4]), 1, name="conv1/bn")
        with pytest.raises(
            CollectiveMismatchError,
            match=r"tower 0 made sum 'conv1/bn'.*\[4\].*"
            r"tower 2 made sum 'conv2/bn'.*\[8\]",
        ):
            reducer.sum(tf.ones([8]), 2, name="conv2/bn")


def test_call_count_mismatch_is_caught_by_check_consistent():
    with tf.Graph().as_default():
        reducer = CrossTowerReducer(cpu_devices(2))
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
        with pytest.raises(ValueError, match="positive number of seconds"):
            CrossTowerReducer(cpu_devices(2), timeout_seconds=0)
        with pytest.raises(ValueError, match="distinct"):
            CrossTowerReducer(["/device:CPU:0", "/cpu:0"])
        reducer = CrossTowerReducer(cpu_devices(2))
        with pytest.raises(ValueError, match=r"tower_index must be an int in \[0, 2\)"):
            reducer.sum(tf.ones([2]), 2)
        with pytest.raises(ValueError, match="share a dtype"):
            reducer.sum([tf.ones([2]), tf.ones([2], tf.int32)], 0)
    with tf.Graph().as_default():
        with pytest.raises(ValueError, match="different graph"):
            reducer.sum(tf.ones([2]), 0)


# A partial fetch runs in a child process with a hard wall-clock bound, so a
# regression that hangs fails this test instead of hanging the suite (and a
# Session whose collectives were aborted stays out of this process). One
# child runs both cases, each in its own Session, to pay for one TF import.
_PARTIAL_FETCH_SCRIPT = textwrap.dedent("""
    import time
    import tensorflow as tf
    from towerlib.collective import (CrossTowerReducer, CollectiveTimeoutError,
                                     explain_collective_errors)
    for mode in ('collective_timeout', 'run_options'):
      with tf.Graph().as_default() as graph:
        reducer = CrossTowerReducer(['/device:CPU:0', '/device:CPU:1'],
                                    timeout_seconds=2.0)
        outs = [reducer.sum(tf.ones([3]), i, name='bn1') for i in range(2)]
        config = tf.compat.v1.ConfigProto(device_count={'CPU': 2})
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


def test_partial_fetch_ends_in_a_clear_error_not_a_hang():
    env = dict(
        os.environ,
        TF_CPP_MIN_LOG_LEVEL="3",
        PYTHONPATH=REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    result = subprocess.run(
        [sys.executable, "-c", _PARTIAL_FETCH_SCRIPT],
        capture_output=True,
        check=False,
        text=True,
        timeout=120,
        env=env,
        cwd=REPO_ROOT,
    )
    reports = {}
    for line in result.stdout.splitlines():
        mode, key, value = (line.split(" ", 2) + ["", ""])[:3]
        reports.setdefault(mode, {})[key] = value
    for mode in ("collective_timeout", "run_options"):
        report = reports.get(mode, {})
        assert "MESSAGE" in report, result.stdout + result.stderr[-3000:]
        assert float(report["ELAPSED"]) < 15.0
        message = report["MESSAGE"]
        assert "same session.run" in message  # says what went wrong
        assert "fetch the train op" in message  # and the fix
        assert "create a new Session" in message  # and the consequence
    message = reports["collective_timeout"]["MESSAGE"]
    assert "bn1_cross_tower_sum" in message  # names the op that waited
    assert "Collective has timed out" in message
    assert "RunOptions.timeout_in_ms" in reports["run_options"]["MESSAGE"]

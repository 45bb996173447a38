"""The graph transport of CrossTowerReducer (towerlib.exchange.graph_hub).

Values and gradients of both transports are compared in test_collective.py;
these tests cover what only the graph transport does: hub ops filled in as
the towers are built, and runs that cannot wait for a missing tower.
"""

import numpy as np
import pytest
import tensorflow as tf

from tests import helpers
from towerlib.exchange import CollectiveMismatchError, CrossTowerReducer, check_fetches


def hub_ops(graph):
    return [op for op in graph.get_operations() if op.type in ("AddN", "ConcatV2")
            and op.name.startswith("cross_tower_exchange")]


def test_cpu_towers_default_to_one_hub_op_per_call_on_the_first_device():
    with tf.Graph().as_default() as graph:
        reducer = CrossTowerReducer(helpers.cpu_devices(3))
        outs = []
        for i in range(3):
            with tf.device(f"/device:CPU:{i}"):
                x = tf.fill([4], float(i + 1))
                total = reducer.sum(x, i, name="bn1")
                rows = reducer.gather_unordered(total, i, name="bn2")
                outs.append((total, rows))
        reducer.check_consistent()
        assert reducer.transport == "graph"
        assert reducer.group_key is None
        assert not [op for op in graph.get_operations() if op.type.startswith("Collective")]
        hubs = hub_ops(graph)
        assert sorted(op.type for op in hubs) == ["AddN", "ConcatV2"]
        for hub in hubs:
            assert hub.device == "/device:CPU:0"
            assert "bn1" in hub.name or "bn2" in hub.name
            # Every slot holds its tower's tensor: no placeholder is left.
            slots = hub.inputs[:3]
            assert [t.op.type for t in slots].count("Placeholder") == 0
            assert [t.device for t in slots] == helpers.cpu_devices(3)
        with helpers.cpu_session(graph, 3) as sess:
            got = sess.run(outs)
    for total, rows in got:
        np.testing.assert_array_equal(total, [6.0] * 4)
        np.testing.assert_array_equal(rows, [[6.0] * 4] * 3)


def test_fetching_one_tower_runs_every_towers_half():
    """A graph edge cannot wait for a tower that is not run: the run pulls it."""
    with tf.Graph().as_default() as graph:
        reducer = CrossTowerReducer(helpers.cpu_devices(3))
        outs = [reducer.sum(tf.constant([float(i)]), i, name="bn1") * 2.0 for i in range(3)]
        check_fetches(outs[0])  # no collective, nothing to refuse
        with helpers.cpu_session(graph, 3) as sess:
            np.testing.assert_array_equal(sess.run(outs[0]), [6.0])


def test_a_tower_that_skips_a_call_fails_at_build_time_and_by_name_at_run_time():
    with tf.Graph().as_default() as graph:
        reducer = CrossTowerReducer(helpers.cpu_devices(2))
        first = reducer.sum(tf.ones([2]), 0, name="bn1")
        reducer.sum(tf.ones([2]), 0, name="bn2")
        reducer.sum(tf.ones([2]), 1, name="bn1")  # tower 1 never calls bn2
        with pytest.raises(CollectiveMismatchError, match="Tower 1 never made reduction #1"):
            reducer.check_consistent()
        with helpers.cpu_session(graph, 2) as sess:
            np.testing.assert_array_equal(sess.run(first), [2.0, 2.0])
            second = hub_ops(graph)[1].outputs[0]
            with pytest.raises(tf.errors.InvalidArgumentError, match="awaiting_tower_1"):
                sess.run(second)


def test_the_hub_takes_nothing_from_the_calling_towers_context():
    """Tower 0's control dependencies and tf.gradients' colocation are its
    own; a hub that inherited them would tie every tower to tower 0's ops."""
    with tf.Graph().as_default() as graph:
        reducer = CrossTowerReducer(helpers.cpu_devices(2))
        barrier = tf.no_op(name="tower0_barrier")
        with tf.device("/device:CPU:1"):
            anchor = tf.ones([2], name="anchor")
        with tf.control_dependencies([barrier]), tf.compat.v1.colocate_with(anchor):
            reducer.sum(tf.ones([2]), 0, name="bn1")
        reducer.sum(tf.ones([2]), 1, name="bn1")
        (hub,) = hub_ops(graph)
    assert hub.control_inputs == []
    assert hub.colocation_groups() == [f"loc:@{hub.name}".encode()]
    assert hub.device == "/device:CPU:0"


def test_the_exchange_is_a_wall_for_autodiff_like_a_collective():
    """Tower 1's result depends on tower 0's tensor only through the exchange.

    Like a collective op, the exchange passes no gradient, and
    tf.custom_gradient does not find tower 0's variable behind it (it would
    demand a `variables` argument of the gradient function if it did).
    """
    with tf.Graph().as_default():
        reducer = CrossTowerReducer(helpers.cpu_devices(2))
        weight = tf.compat.v1.get_variable(
            "w", initializer=tf.ones([2]), use_resource=True)
        reducer.gather_unordered(weight * 3.0, 0, name="rows")

        @tf.custom_gradient
        def uses_the_rows(x):
            rows = reducer.gather_unordered(x, 1, name="rows")
            return x * tf.reduce_sum(rows), lambda upstream: upstream

        x1 = tf.ones([2])
        y1 = uses_the_rows(x1)  # raises TypeError if the wall is missing
        assert tf.gradients(tf.reduce_sum(y1), x1)[0] is not None

        # And no gradient crosses the exchange itself.
        reducer.gather_unordered(weight * 5.0, 0, name="more_rows")
        rows = reducer.gather_unordered(tf.ones([2]), 1, name="more_rows")
        assert tf.gradients(tf.reduce_sum(rows), weight) == [None]


@pytest.mark.parametrize("prefix", ["", "/job:worker/replica:0/task:1"])
def test_gpu_towers_keep_nccl_collectives_unless_the_graph_transport_is_asked_for(prefix):
    """Built only (no GPU here): what the device strings decide."""
    devices = [f"{prefix}/device:GPU:{i}" for i in range(2)]
    with tf.Graph().as_default() as graph:
        default = CrossTowerReducer(devices)
        for i in range(2):
            default.sum(tf.ones([2]), i, name="bn1")
        assert default.transport == "collective"
        assert default.communication_hint == "nccl"
        asked = CrossTowerReducer(devices, transport="graph")
        for i in range(2):
            with tf.device(devices[i]):
                asked.sum(tf.ones([2]), i, name="bn1")
        (hub,) = hub_ops(graph)
    assert tf.DeviceSpec.from_string(hub.device) == tf.DeviceSpec.from_string(devices[0])


def test_the_hub_keeps_the_job_and_task_an_enclosing_scope_gives_bare_devices():
    """Bare tower devices under a worker's scope: the hub must not lose the
    job and task (in a cluster it could land on another task)."""
    with tf.Graph().as_default() as graph:
        with tf.device("/job:worker/replica:0/task:1"):
            reducer = CrossTowerReducer(helpers.cpu_devices(2))
            for i in range(2):
                with tf.device(f"/device:CPU:{i}"):
                    reducer.sum(tf.ones([2]), i, name="bn1")
        (hub,) = hub_ops(graph)
    assert tf.DeviceSpec.from_string(hub.device) == tf.DeviceSpec.from_string(
        "/job:worker/replica:0/task:1/device:CPU:0")


def test_collective_only_arguments_are_refused_with_the_graph_transport():
    with tf.Graph().as_default():
        with pytest.raises(ValueError, match="pass transport='collective' with it"):
            CrossTowerReducer(helpers.cpu_devices(2), group_key=12345)

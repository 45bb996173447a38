"""What build_sync_train_graph keeps of build_train_graph: the NaN guard on TrainGraph
(no registry); replicated variables refused (they are for one machine)."""

import numpy as np
import pytest
import tensorflow as tf

import towerlib
from towerlib import cluster as cluster_lib
from towerlib import layers


def _tower(inputs, ctx):
    del ctx
    return tf.reduce_mean(tf.square(layers.dense(inputs, 1, name="fc")))


def _batch():
    return tf.constant(np.ones([4, 3], np.float32))


def test_build_train_graph_records_the_guard_it_was_given():
    with tf.Graph().as_default():
        guard = towerlib.guard_numerics(tf.compat.v1.train.GradientDescentOptimizer(0.1))
        guarded = towerlib.build_train_graph(_tower, _batch(), guard, num_towers=2)
        assert guarded.numerics_guards == (guard,)
    with tf.Graph().as_default():
        plain = towerlib.build_train_graph(
            _tower, _batch(), tf.compat.v1.train.GradientDescentOptimizer(0.1), num_towers=2)
        assert plain.numerics_guards == ()


def test_sync_replicas_graph_keeps_the_guard_inside_its_wrapper():
    cluster = cluster_lib.cluster_from_flags(
        ps_hosts="localhost:1", worker_hosts="localhost:2", job_name="worker", task_index=0)
    with tf.Graph().as_default():
        guard = towerlib.guard_numerics(tf.compat.v1.train.GradientDescentOptimizer(0.1))
        placer = cluster_lib.ParameterServerPlacer(cluster)
        with tf.compat.v1.device(placer):
            batch = _batch()
        sync_graph = cluster_lib.build_sync_train_graph(
            _tower, batch, guard, cluster, num_towers=2, device_type="cpu",
            device_function=placer)
        assert sync_graph.train_graph.numerics_guards == (guard,)


@pytest.mark.parametrize("option,match", [
    (dict(update="replicated"), r"has 1 ps task\(s\)\. Fix: drop the ps tasks"),
    (dict(precision="float16"), r"Float16\(\) with SyncReplicasOptimizer"),
])
def test_sync_replicas_refuse_options_for_one_machine(option, match):
    """Replicated copies all-reduce across workers without ps tasks (this cluster has
    one), and float16's skipped steps (a replica that skips sends nothing and the
    others would wait) have no place with SyncReplicasOptimizer."""
    cluster = cluster_lib.cluster_from_flags(
        ps_hosts="localhost:1", worker_hosts="localhost:2", job_name="worker", task_index=0)
    with tf.Graph().as_default():
        with pytest.raises((ValueError, TypeError), match=match):
            cluster_lib.build_sync_train_graph(
                _tower, _batch(), tf.compat.v1.train.GradientDescentOptimizer(0.1), cluster,
                num_towers=2, device_type="cpu", **option)


@pytest.mark.parametrize("update", ["parameter_server", "replicated"])
def test_either_updates_result_has_train_graphs_fields(update):
    """A hook written for one machine's TrainGraph reads .loss, .tower_shares... here too."""
    ps_hosts = "localhost:1" if update == "parameter_server" else ""
    cluster = cluster_lib.cluster_from_flags(
        ps_hosts=ps_hosts, worker_hosts="localhost:2,localhost:3", job_name="worker",
        task_index=0)
    with tf.Graph().as_default():
        options = {}
        if update == "parameter_server":
            options["device_function"] = cluster_lib.ParameterServerPlacer(cluster)
        with tf.compat.v1.device(options.get("device_function")):
            batch = _batch()
        graph = cluster_lib.build_sync_train_graph(
            _tower, batch, tf.compat.v1.train.GradientDescentOptimizer(0.1), cluster,
            num_towers=2, device_type="cpu", update=update, **options)
        for field in ("loss", "tower_shares", "train_op", "global_step", "devices"):
            assert getattr(graph, field) is getattr(graph.train_graph, field)
        with pytest.raises(AttributeError):
            graph.no_such_field  # noqa: B018


def test_the_global_batch_input_through_ps_tasks_is_refused_in_one_line():
    """Its counters must be each worker's own; a placer would share them on a ps task."""
    cluster = cluster_lib.cluster_from_flags(
        ps_hosts="localhost:1", worker_hosts="localhost:2,localhost:3", job_name="worker",
        task_index=0)
    with tf.Graph().as_default():
        placer = cluster_lib.ParameterServerPlacer(cluster)
        with tf.compat.v1.device(placer):
            batch = towerlib.global_batch_input(np.ones([10, 3], np.float32), 4, seed=1,
                                                workers=cluster.worker_group)
        with pytest.raises(ValueError, match="Fix: update=towerlib.Replicated") as raised:
            cluster_lib.build_sync_train_graph(
                _tower, batch, tf.compat.v1.train.GradientDescentOptimizer(0.1), cluster,
                num_towers=2, device_type="cpu", device_function=placer)
        assert "\n" not in str(raised.value)

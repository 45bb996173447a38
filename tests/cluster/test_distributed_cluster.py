"""towerlib.cluster without processes: cluster descriptions, placement, graph structure.

Graphs here name /job:ps and /job:worker devices but never run; the
processes tests (test_distributed_training.py) run them.
"""

import json
import re

import pytest
import tensorflow as tf

import towerlib
from towerlib import cluster as cluster_lib
from towerlib import layers

PS = "127.0.0.1:2222"
WORKERS = "127.0.0.1:2223,127.0.0.1:2224"


def two_worker_cluster(task_index=0, num_ps=1):
    ps_hosts = ",".join(f"127.0.0.1:{3000 + i}" for i in range(num_ps))
    return cluster_lib.cluster_from_flags(ps_hosts, WORKERS, "worker", task_index)


# ----------------------------------------------------------------- flags

def test_flags_describe_the_cluster_and_this_task():
    worker1 = cluster_lib.cluster_from_flags(PS, WORKERS, "worker", 1)
    assert worker1.num_ps == 1
    assert worker1.num_replicas == 2
    assert not worker1.is_chief and not worker1.is_ps
    assert worker1.replica_index == 1
    assert worker1.task_device == "/job:worker/task:1"
    assert worker1.cluster_spec.as_dict() == {
        "ps": [PS], "worker": WORKERS.split(",")}
    assert cluster_lib.cluster_from_flags(PS, WORKERS, "worker", 0).is_chief
    ps = cluster_lib.cluster_from_flags(PS, WORKERS, "ps", 0)
    assert ps.is_ps and not ps.is_chief
    with pytest.raises(ValueError, match="not a replica"):
        ps.replica_index


def test_no_cluster_flags_and_no_tf_config_mean_one_machine():
    assert cluster_lib.cluster_from_flags() is None
    assert cluster_lib.resolve_cluster(environ={}) is None
    assert cluster_lib.resolve_cluster(environ={"TF_CONFIG": "{}"}) is None


@pytest.mark.parametrize("ps_hosts, worker_hosts, job_name, task_index, message", [
    (PS, "", "worker", 0, "missing: --worker_hosts"),
    (PS, WORKERS, "", 0, "missing: --job_name"),
    (PS, WORKERS, "chief", 0, "use 'ps' or 'worker'"),
    (PS, WORKERS, "worker", 2, r"task index 2 is out of range .*valid: 0\.\.1"),
    (PS, WORKERS, "ps", 1, "task index 1 is out of range"),
    ("localhost", WORKERS, "worker", 0, "--ps_hosts: 'localhost' is not a 'host:port'"),
    (PS, "127.0.0.1:2223,,127.0.0.1:2224", "worker", 0, "'' is not a 'host:port'"),
    ("127.0.0.1:99999", WORKERS, "worker", 0, "port '99999'"),
    ("127.0.0.1:2223", WORKERS, "worker", 0, "given to both ps:0 and worker:0"),
])
def test_bad_cluster_flags_name_the_problem(ps_hosts, worker_hosts, job_name,
                                            task_index, message):
    with pytest.raises(ValueError, match=message):
        cluster_lib.cluster_from_flags(ps_hosts, worker_hosts, job_name, task_index)


# ------------------------------------------------------------- TF_CONFIG

def tf_config(task_type, index, chief=True):
    cluster = {"ps": [PS], "worker": WORKERS.split(",")}
    if chief:
        cluster["chief"] = ["127.0.0.1:2225"]
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})


def test_tf_config_with_a_chief_job():
    chief = cluster_lib.resolve_cluster(environ={"TF_CONFIG": tf_config("chief", 0)})
    worker1 = cluster_lib.resolve_cluster(environ={"TF_CONFIG": tf_config("worker", 1)})
    worker0 = cluster_lib.cluster_from_tf_config(tf_config("worker", 0))
    assert chief.num_replicas == worker1.num_replicas == 3
    assert chief.is_chief and chief.replica_index == 0
    assert not worker0.is_chief and worker0.replica_index == 1
    assert worker1.replica_index == 2 and worker1.task_device == "/job:worker/task:1"


def test_tf_config_without_a_chief_job_makes_worker_0_the_chief():
    worker0 = cluster_lib.cluster_from_tf_config(tf_config("worker", 0, chief=False))
    assert worker0.is_chief and worker0.replica_index == 0 and worker0.num_replicas == 2


@pytest.mark.parametrize("value, message", [
    ("{not json", "TF_CONFIG is not valid JSON"),
    (json.dumps({"cluster": {"ps": [PS], "worker": [PS + "0"]}}), 'no "task"'),
    (tf_config("evaluator", 0), "'evaluator' does not train"),
    (json.dumps({"cluster": {"ps": [PS], "master": ["127.0.0.1:1"]},
                 "task": {"type": "master", "index": 0}}), r"unknown job\(s\) \['master'\]"),
    (json.dumps({"cluster": {"ps": [PS], "worker": ["127.0.0.1:1"],
                             "chief": ["127.0.0.1:2", "127.0.0.1:3"]},
                 "task": {"type": "chief", "index": 0}}), "exactly one"),
])
def test_bad_tf_config_names_the_problem(value, message):
    with pytest.raises(ValueError, match=message):
        cluster_lib.resolve_cluster(environ={"TF_CONFIG": value})


def test_flags_and_tf_config_together_are_ambiguous():
    with pytest.raises(ValueError, match="Both the cluster flags and TF_CONFIG"):
        cluster_lib.resolve_cluster(PS, WORKERS, "worker", 0,
                                    environ={"TF_CONFIG": tf_config("worker", 0)})


# ------------------------------------------------------ devices, configs

def test_tower_devices_and_session_config_of_a_worker():
    worker1 = two_worker_cluster(task_index=1)
    assert cluster_lib.tower_devices(worker1, 2, "cpu") == [
        "/job:worker/task:1/device:CPU:0", "/job:worker/task:1/device:CPU:1"]
    config = cluster_lib.session_config(worker1, num_towers=2)
    assert list(config.device_filters) == ["/job:ps", "/job:worker/task:1"]
    assert config.device_count["CPU"] == 2
    ps_config = cluster_lib.session_config(
        cluster_lib.cluster_from_flags(PS, WORKERS, "ps", 0))
    assert list(ps_config.device_filters) == ["/job:ps/task:0"]


def test_variables_go_to_the_least_loaded_ps_task_by_bytes():
    placer = cluster_lib.ParameterServerPlacer(two_worker_cluster(task_index=1, num_ps=2))
    sizes = {"big": 1000, "small_a": 10, "small_b": 10, "medium": 500, "last": 100}
    with tf.Graph().as_default(), tf.compat.v1.device(placer):
        created = {name: tf.compat.v1.get_variable(name, [size])
                   for name, size in sizes.items()}
        product = created["big"] * 2.0
        with tf.device("/job:worker/task:1/device:CPU:0"):
            pinned = tf.compat.v1.get_variable("pinned", [7])
    ps0, ps1 = "/job:ps/task:0/device:CPU:0", "/job:ps/task:1/device:CPU:0"
    # big -> ps0 (4000 B); then ps1 is lighter for small_a, small_b, medium, last.
    assert {name: v.device for name, v in created.items()} == {
        "big": ps0, "small_a": ps1, "small_b": ps1, "medium": ps1, "last": ps1}
    assert placer.bytes_per_task == [4000, 40 + 40 + 2000 + 400]
    assert product.device == "/job:worker/task:1"
    assert pinned.device == "/job:worker/task:1/device:CPU:0"


# ------------------------------------------------------- train graph

def conv_bn_model(inputs, ctx):
    """[n, 6, 6, 2] images, [n] labels -> mean cross-entropy; one batch norm."""
    images, labels = inputs
    h = layers.conv2d(images, 4, 3, name="conv1", use_bias=False)
    h = tf.nn.relu(towerlib.batch_norm(h, ctx, name="bn1"))
    logits = layers.dense(layers.flatten(h), 3, name="logits")
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=labels, logits=logits))


def build(cluster, bn_mode="first_tower", **kwargs):
    placer = cluster_lib.ParameterServerPlacer(cluster)
    with tf.compat.v1.device(placer):
        images = tf.random.normal([8, 6, 6, 2], seed=1)
        labels = tf.zeros([8], tf.int32)
    return cluster_lib.build_sync_train_graph(
        conv_bn_model, (images, labels), tf.compat.v1.train.GradientDescentOptimizer(0.1),
        cluster, num_towers=2, device_type="cpu", bn_mode=bn_mode,
        device_function=placer, **kwargs)


def upstream_ops(*roots):
    """Every op the roots need to run: inputs and control inputs, transitively."""
    seen, stack = set(), [tf.convert_to_tensor(r).op if not isinstance(r, tf.Operation)
                          else r for r in roots]
    while stack:
        op = stack.pop()
        if op in seen:
            continue
        seen.add(op)
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    return seen


def as_op(op_or_tensor):
    """The op of an update (assign_sub returns a variable-like handle, not an op)."""
    return op_or_tensor if isinstance(op_or_tensor, tf.Operation) else op_or_tensor.op


def take_grad_ops(ops):
    return [op for op in ops if "TakeGradient" in op.type]


def test_sync_batch_norm_cannot_span_workers():
    with tf.Graph().as_default() as graph:
        with pytest.raises(ValueError, match="bn_mode='sync' cannot span the 2 workers"):
            build(two_worker_cluster(), bn_mode="sync")
        assert not tf.compat.v1.global_variables(), "raised before building anything"
        del graph


def test_build_sync_train_graph_rejects_what_the_cluster_decides():
    chief = two_worker_cluster()
    ps = cluster_lib.cluster_from_flags(PS, WORKERS, "ps", 0)
    sgd = tf.compat.v1.train.GradientDescentOptimizer(0.1)
    with tf.Graph().as_default():
        inputs = (tf.zeros([4, 6, 6, 2]), tf.zeros([4], tf.int32))
        with pytest.raises(ValueError, match="a ps task only serves variables"):
            cluster_lib.build_sync_train_graph(conv_bn_model, inputs, sgd, ps)
        with pytest.raises(TypeError, match="unexpected keyword argument 'devices'"):
            cluster_lib.build_sync_train_graph(conv_bn_model, inputs, sgd, chief,
                                               devices=["/device:CPU:0"])
        with pytest.raises(TypeError, match="Pass the plain optimizer"):
            cluster_lib.build_sync_train_graph(
                conv_bn_model, inputs,
                tf.compat.v1.train.SyncReplicasOptimizer(sgd, 2), chief)


def test_variables_on_ps_local_step_and_tower_gradient_sums_on_the_worker():
    with tf.Graph().as_default() as graph:
        sync = build(two_worker_cluster(task_index=1))
        for variable in tf.compat.v1.global_variables():
            assert variable.device == "/job:ps/task:0/device:CPU:0", variable.name
        (local_step,) = tf.compat.v1.local_variables()
        assert local_step.device.startswith("/job:worker/task:1")
        sums = [op for op in graph.get_operations()
                if op.name.startswith("aggregate_gradients/") and op.type == "AddN"]
        assert len(sums) == len(sync.train_graph.grads_and_vars) == 5
        for op in sums:
            # One summed gradient per variable leaves the worker, not one per tower.
            assert op.device == "/job:worker/task:1/device:CPU:0", op.name


def test_only_the_chief_step_aggregates_and_sync_state_ignores_batch_norm_updates():
    for task_index in (0, 1):
        with tf.Graph().as_default():
            sync = build(two_worker_cluster(task_index=task_index))
            optimizer, train = sync.optimizer, sync.train_graph
            update_ops = {as_op(update) for update in train.update_ops}
            assert len(update_ops) == 2  # moving mean and variance, once
            step_needs = upstream_ops(train.train_op)
            # This replica's step runs its batch-norm updates ...
            assert update_ops <= step_needs
            # ... and, on the chief only, the aggregation (take the mean, apply).
            assert bool(take_grad_ops(step_needs)) == (task_index == 0)
            # Initializers and the aggregation never run a forward pass or an update.
            for op in (optimizer.aggregation_op, optimizer.chief_init_op,
                       optimizer.local_step_init_op):
                assert not update_ops & upstream_ops(op), op.name
            assert len(sync.hooks) == 1


def test_weights_moving_average_is_updated_once_per_global_step_by_the_chief():
    for task_index in (0, 1):
        with tf.Graph().as_default():
            sync = build(two_worker_cluster(task_index=task_index), ema_decay=0.9)
            ema = sync.train_graph.ema
            assert ema is not None
            averages = [ema.average(v) for v in tf.compat.v1.trainable_variables()]
            assert all(a is not None and a.device.startswith("/job:ps") for a in averages)
            ema_updates = {op for op in upstream_ops(sync.optimizer.aggregation_op)
                           if "AssignMovingAvg" in op.name}
            assert ema_updates
            runs_ema = bool(ema_updates & upstream_ops(sync.train_graph.train_op))
            assert runs_ema == (task_index == 0)


def test_a_tf_config_with_a_task_and_no_cluster_is_refused():
    """It trained alone on one machine without a word."""
    for value in ('{"task": {"type": "worker", "index": 1}}',
                  '{"cluster": {}, "task": {"type": "worker", "index": 0}}'):
        with pytest.raises(ValueError, match=r'TF_CONFIG has a "task" but no "cluster"'):
            cluster_lib.resolve_cluster(environ={"TF_CONFIG": value})
    assert cluster_lib.resolve_cluster(environ={"TF_CONFIG": "{}"}) is None


@pytest.mark.parametrize("cluster, got", [("worker:0", "str"), (None, "None (one machine)"),
                                          ({"worker": ["a:1"]}, "dict")])
def test_a_cluster_argument_that_is_no_cluster_is_named(cluster, got):
    """A bare AttributeError ('str' object has no attribute 'is_ps'),
    or for None a message about ps tasks."""
    for where, call in (
            ("build_sync_train_graph", lambda: cluster_lib.build_sync_train_graph(
                lambda x, ctx: tf.reduce_mean(x), tf.ones([4, 2]),
                tf.compat.v1.train.GradientDescentOptimizer(0.1), cluster, num_towers=2)),
            ("start_server", lambda: cluster_lib.start_server(cluster, 2)),
            ("run_parameter_server", lambda: cluster_lib.run_parameter_server(cluster))):
        with tf.Graph().as_default():
            with pytest.raises(TypeError, match=rf"{where} takes this task's ClusterInfo, "
                               rf"got {re.escape(got)}\. Fix: cluster = "):
                call()


def _tf_config(cluster, **extra):
    return json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 0}, **extra})


@pytest.mark.parametrize("value, message", [
    (_tf_config({"worker": ["localhost:2222", "127.0.0.1:2222"]}),
     r"127\.0\.0\.1:2222 is given to both worker:0 and worker:1 \(as localhost:2222: one "
     r"port of this machine under two spellings\)"),
    (_tf_config({"worker": ["Node1:2222"], "ps": ["node1:2222"]}), "under two spellings"),
    (_tf_config({"worker": ["a:1"]}, rpc_layer="grpc+verbs"),
     r"rpc_layer='grpc\+verbs': towerlib's servers speak gRPC only"),
    (_tf_config({"worker": {"1": "a:1", "2": "b:2"}}),
     r"the sparse form \{task index: address\} with the indices \['1', '2'\] lists not "
     r"every task"),
])
def test_tf_configs_that_were_taken_silently_are_refused(value, message):
    with pytest.raises(ValueError, match=message) as raised:
        cluster_lib.resolve_cluster(environ={"TF_CONFIG": value})
    assert "\n" not in str(raised.value)


def test_tf_configs_sparse_form_and_grpc_rpc_layer_are_taken_as_tensorflow_takes_them():
    cluster = cluster_lib.resolve_cluster(environ={"TF_CONFIG": _tf_config(
        {"worker": {"1": "b:2", "0": "a:1"}}, rpc_layer="grpc")})
    assert cluster.jobs == {"worker": ("a:1", "b:2")}
    assert cluster.cluster_spec.as_dict() == tf.train.ClusterSpec(
        {"worker": {0: "a:1", 1: "b:2"}}).as_dict()


@pytest.mark.parametrize("hosts, message", [
    ("grpc://a:1", r"'grpc://a:1' has the scheme 'grpc://'.*Fix: 'a:1'"),
    ("my host:1", r"'my host:1' has the host 'my host', which is no host name"),
    ("a/b:1", r"has the host 'a/b'"),
])
def test_worker_hosts_that_are_no_host_and_port_are_refused(hosts, message):
    with pytest.raises(ValueError, match=message):
        cluster_lib.cluster_from_flags("", hosts, "worker", 0)


def test_ipv6_and_hostnames_with_dashes_are_addresses():
    cluster = cluster_lib.cluster_from_flags("", "[::1]:5000,node-1.example_x:5001",
                                             "worker", 0)
    assert cluster.jobs["worker"] == ("[::1]:5000", "node-1.example_x:5001")

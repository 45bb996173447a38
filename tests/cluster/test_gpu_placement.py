"""Placement on GPU device strings, checked on the built graph (no GPU needed).

Nothing here runs a session: it verifies that every op is pinned where a
multi-GPU machine needs it, so correctness does not rest on CPU-only runs.
"""

import functools

import tensorflow as tf

import towerlib
from tests import helpers

GPUS = ["/device:GPU:0", "/device:GPU:1"]


# build_on(devices=...): the conv+bn model with per-tower statistics, with momentum.
build_on = functools.partial(
    helpers.build_on_image_batch, optimizer_kind="momentum", bn_mode="all_towers")


def ops_named(graph, prefix):
    return [op for op in graph.get_operations() if op.name.startswith(prefix)]


def test_tower_compute_on_its_gpu_and_variables_on_the_host_cpu():
    graph = tf.Graph()
    with graph.as_default():
        train = build_on(devices=GPUS)
        for index, device in enumerate(GPUS):
            convolutions = [op for op in ops_named(graph, f"tower_{index}/")
                            if op.type == "Conv2D"]
            assert convolutions and all(op.device == device for op in convolutions)
            gradient_convolutions = [
                op for op in graph.get_operations()
                if op.type == "Conv2DBackpropFilter" and f"tower_{index}/" in op.name]
            assert gradient_convolutions
            assert all(op.device == device for op in gradient_convolutions)
        for var in tf.compat.v1.global_variables():
            assert var.device == "/device:CPU:0", var
        # Gradients are summed where the variable lives.
        for grad, var in train.grads_and_vars:
            assert grad.device == var.device
        # The global batch is split on the host, not on GPU 0.
        splits = [op for op in ops_named(graph, "split_global_batch/") if op.type == "SplitV"]
        assert splits and all(op.device == "/device:CPU:0" for op in splits)


def test_gpu_parameter_device_spreads_variables_over_the_gpus():
    with tf.Graph().as_default():
        build_on(devices=GPUS, update=towerlib.ParameterServer(device="gpu"))
        devices = {v.device for v in tf.compat.v1.trainable_variables()}
        assert devices == set(GPUS)


def test_remote_worker_devices_keep_their_job_and_task():
    worker_gpus = [f"/job:worker/task:1/device:GPU:{i}" for i in range(2)]
    graph = tf.Graph()
    with graph.as_default():
        build_on(devices=worker_gpus)
        for var in tf.compat.v1.global_variables():
            assert var.device == "/job:worker/task:1/device:CPU:0", var
        convolutions = [op for op in ops_named(graph, "tower_1/") if op.type == "Conv2D"]
        assert all(op.device == worker_gpus[1] for op in convolutions)


def test_an_inner_device_scope_in_the_tower_function_wins():
    def model(inputs, ctx):
        with tf.device("/device:CPU:0"):
            host_side = tf.identity(inputs[0], name="on_host")
        return helpers.conv_dense_model((host_side, inputs[1]), ctx)

    graph = tf.Graph()
    with graph.as_default():
        helpers.build_on_image_batch(tower_fn=model, devices=GPUS)
        assert graph.get_operation_by_name("tower_1/on_host").device == "/device:CPU:0"

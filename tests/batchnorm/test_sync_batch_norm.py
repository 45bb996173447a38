"""bn_mode='sync' on 2-4 virtual CPU devices against plain TF on one device.

The reference is plain TensorFlow 1.x code on one device: its batch norm is
written here with tf.nn.moments and UPDATE_OPS, independent of towerlib's, and
it trains on the whole global batch with `minimize`. Both runs start from the
same weights, set by variable name from numpy.
"""

import functools
import textwrap
import time

import numpy as np
import pytest
import tensorflow as tf

import towerlib
from tests import half_precision, helpers
from towerlib import layers
from towerlib.exchange import (
    CollectiveMismatchError,
    CrossTowerReducer,
    PartialFetchError,
    check_fetches,
)

# Far from the default 0.99 so that 5 steps move the moving statistics a lot:
# a wrong statistic cannot hide behind a slow average.
BN_MOMENTUM = 0.5

HALF = pytest.mark.half_precision


def plain_tf_batch_norm(x, ctx, name):
    """Reference batch norm: whole-batch moments, updates in UPDATE_OPS."""
    del ctx
    channels = x.shape[-1]
    with tf.compat.v1.variable_scope(name):
        beta = tf.compat.v1.get_variable("beta", [channels], initializer=tf.zeros_initializer())
        gamma = tf.compat.v1.get_variable("gamma", [channels], initializer=tf.ones_initializer())
        moving_mean = tf.compat.v1.get_variable(
            "moving_mean", [channels], initializer=tf.zeros_initializer(), trainable=False
        )
        moving_variance = tf.compat.v1.get_variable(
            "moving_variance", [channels], initializer=tf.ones_initializer(), trainable=False
        )
        mean, variance = tf.nn.moments(x, list(range(x.shape.rank - 1)))
        for variable, value in ((moving_mean, mean), (moving_variance, variance)):
            tf.compat.v1.add_to_collection(
                tf.compat.v1.GraphKeys.UPDATE_OPS,
                variable.assign(BN_MOMENTUM * variable + (1 - BN_MOMENTUM) * value),
            )
        return tf.nn.batch_normalization(x, mean, variance, beta, gamma, 1e-3)


def towerlib_batch_norm(x, ctx, name):
    return towerlib.batch_norm(x, ctx, name=name, momentum=BN_MOMENTUM, epsilon=1e-3)


def conv_dense_model(inputs, ctx, batch_norm=towerlib_batch_norm, extra_batch_norm_in_tower=None):
    """[B, 6, 6, 2] images -> conv, bn, relu, pool, dense, bn, relu, dense."""
    images, labels = inputs
    h = layers.conv2d(images, 4, 3, name="conv1", use_bias=False)
    h = tf.nn.relu(batch_norm(h, ctx, "bn_conv1"))
    h = layers.flatten(layers.max_pool2d(h, 2, 2))
    h = layers.dense(h, 8, name="fc1", use_bias=False)
    h = tf.nn.relu(batch_norm(h, ctx, "bn_fc1"))
    if extra_batch_norm_in_tower is not None and (ctx.index == extra_batch_norm_in_tower):
        with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope(), reuse=True):
            h = batch_norm(h, ctx, "bn_fc1")  # reuses the layer: no new variable
    logits = layers.dense(h, helpers.NUM_CLASSES, name="logits")
    return tf.reduce_mean(
        tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    )


def dense_model(inputs, ctx, batch_norm=towerlib_batch_norm):
    """[B, 6, 6, 2] images -> flatten, dense, bn, relu, dense (no convolution)."""
    images, labels = inputs
    h = layers.dense(layers.flatten(images), 8, name="fc1", use_bias=False)
    h = tf.nn.relu(batch_norm(h, ctx, "bn_fc1"))
    logits = layers.dense(h, helpers.NUM_CLASSES, name="logits")
    return tf.reduce_mean(
        tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    )


def train_reference(data, optimizer_kind, model=conv_dense_model):
    """Plain TF 1 on one device, whole global batch; final variables by name."""
    graph = tf.Graph()
    with graph.as_default():
        images = tf.compat.v1.placeholder(tf.float32, data[0][0].shape)
        labels = tf.compat.v1.placeholder(tf.int32, data[0][1].shape)
        loss = model((images, labels), None, batch_norm=plain_tf_batch_norm)
        with tf.control_dependencies(
            tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)
        ):
            train_op = helpers.make_optimizer(optimizer_kind).minimize(loss)
        variables = helpers.model_variables()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            helpers.load_values(sess, variables, helpers.initial_values_for(variables))
            for image_batch, label_batch in data:
                sess.run(train_op, {images: image_batch, labels: label_batch})
            return {v.op.name: sess.run(v) for v in variables}


def train_towerlib(
    data, num_towers, optimizer_kind, bn_mode="sync", param_device="cpu", shard_sizes=None,
    devices=None, dynamic_batch=False, model=conv_dense_model, transport=None,
):
    """towerlib on `num_towers` virtual CPUs; final variables by name.

    shard_sizes: if given, each tower reads its own slice of the global batch
    through an input function (ctx -> batch), with these (unequal) sizes.
    devices: the towers' devices, in tower order (default CPU:0, CPU:1, ...).
    dynamic_batch: feed through placeholders whose batch size is unknown
      when the graph is built (counts are then computed at run time).
    transport: the exchange (None: the default for CPU towers, 'graph').
    """
    graph = tf.Graph()
    with graph.as_default():
        leading = [None] if dynamic_batch else list(data[0][0].shape[:1])
        images = tf.compat.v1.placeholder(tf.float32, leading + list(data[0][0].shape[1:]))
        labels = tf.compat.v1.placeholder(tf.int32, leading + list(data[0][1].shape[1:]))
        inputs = (images, labels)
        if shard_sizes is not None:
            assert sum(shard_sizes) == data[0][0].shape[0]
            starts = np.cumsum([0] + list(shard_sizes))

            def inputs(ctx):
                begin, end = starts[ctx.index], starts[ctx.index + 1]
                return images[begin:end], labels[begin:end]

        train = towerlib.build_train_graph(
            model,
            inputs,
            helpers.make_optimizer(optimizer_kind),
            devices=devices or helpers.cpu_devices(num_towers),
            bn_mode=bn_mode,
            update=towerlib.ParameterServer(device=param_device),
            exchange=(towerlib.CollectiveExchange(timeout_seconds=60)
                      if transport == "collective" else transport),
            summaries=False,
        )
        variables = helpers.model_variables()
        with tf.compat.v1.Session(config=towerlib.session_config(num_towers)) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            helpers.load_values(sess, variables, helpers.initial_values_for(variables))
            for image_batch, label_batch in data:
                sess.run(train.train_op, {images: image_batch, labels: label_batch})
            return {v.op.name: sess.run(v) for v in variables}


@pytest.mark.parametrize("transport", ["graph", "collective"])
@pytest.mark.parametrize(
    "num_towers,global_batch,optimizer_kind",
    [
        (2, 16, "sgd"),
        (3, 17, "momentum"),  # 17 = 6 + 6 + 5: not divisible
        (4, 18, "sgd"),  # 18 = 5 + 5 + 4 + 4
    ],
)
def test_sync_training_matches_one_device_on_the_global_batch(
    num_towers, global_batch, optimizer_kind, transport
):
    data = helpers.image_batches(global_batch, seed=num_towers)
    want = train_reference(data, optimizer_kind)
    got = train_towerlib(data, num_towers, optimizer_kind, transport=transport)
    assert any(k.endswith("bn_conv1/moving_variance") for k in got)
    assert any(k.endswith("bn_fc1/gamma") for k in got)
    assert helpers.max_abs_difference(got, want) <= 1e-5


def test_per_tower_statistics_would_fail_the_same_comparison():
    """The comparison above has teeth: shard statistics are measurably off."""
    data = helpers.image_batches(16, seed=2)
    want = train_reference(data, "sgd")
    got = train_towerlib(data, 2, "sgd", bn_mode="all_towers")
    assert helpers.max_abs_difference(got, want) > 1e-3


@pytest.mark.parametrize("param_device,transport", [("gpu", "graph"), ("cpu", "collective")])
def test_sync_with_input_function_unequal_shards_and_param_device(param_device, transport):
    data = helpers.image_batches(15, seed=5)
    want = train_reference(data, "momentum")
    got = train_towerlib(data, 3, "momentum", param_device=param_device, shard_sizes=[8, 3, 4],
                         transport=transport)
    assert helpers.max_abs_difference(got, want) <= 1e-5


@pytest.mark.parametrize("transport", ["graph", "collective"])
def test_an_empty_shard_weighs_nothing(transport):
    """An input function may give a tower no examples: its count of 0 drops
    it from the statistics, and the rest train as one device would.

    A dense model: in TF 2.21 on CPU, a convolution of an empty batch returns
    the input's channel count ([0, 6, 6, 2] for 4 filters), which no batch
    norm can fix.
    """
    data = helpers.image_batches(10, seed=11)
    want = train_reference(data, "sgd", model=dense_model)
    got = train_towerlib(data, 3, "sgd", shard_sizes=[6, 0, 4], model=dense_model,
                         transport=transport)
    assert helpers.max_abs_difference(got, want) <= 1e-5


@pytest.mark.parametrize("transport", ["graph", "collective"])
def test_sync_with_a_batch_size_known_only_at_run_time(transport):
    data = helpers.image_batches(17, seed=9)  # 6 + 6 + 5 after the run-time split
    want = train_reference(data, "momentum")
    got = train_towerlib(data, 3, "momentum", dynamic_batch=True, transport=transport)
    assert helpers.max_abs_difference(got, want) <= 1e-5


@pytest.mark.parametrize("transport", ["graph", "collective"])
def test_sync_is_exact_when_tower_order_differs_from_device_order(transport):
    """TensorFlow ranks a collective's members by device, not by tower index.

    Tower 0 on CPU:2 is rank 2 of the all-gather; a layer that read "its" row
    by tower index would normalize with, and differentiate through, another
    tower's pivot.
    """
    data = helpers.image_batches(15, seed=8)
    want = train_reference(data, "sgd")
    got = train_towerlib(
        data, 3, "sgd", shard_sizes=[6, 2, 7],
        devices=["/device:CPU:2", "/device:CPU:0", "/device:CPU:1"], transport=transport)
    assert helpers.max_abs_difference(got, want) <= 1e-5


@pytest.mark.parametrize("transport", ["graph", "collective"])
@pytest.mark.parametrize("num_towers,shard_sizes", [(2, [7, 3]), (3, [5, 1, 4])])
def test_large_mean_small_spread_keeps_an_accurate_variance(num_towers, shard_sizes, transport):
    """Inputs around 1e4 with spread 0.05: E[x^2] - E[x]^2 in float32 would be
    off by several units (its terms are ~1e8, float32 spacing there is 8); the
    variances here are 4e-4 to 1e-2 and must come out to 1e-5 relative."""
    rng = np.random.RandomState(0)
    scales = np.array([0.05, 0.02, 0.1], np.float32)
    x = (1e4 + scales * rng.randn(sum(shard_sizes), 5, 3)).astype(np.float32)
    starts = np.cumsum([0] + shard_sizes)
    with tf.Graph().as_default():
        devices = helpers.cpu_devices(num_towers)
        reducer = CrossTowerReducer(devices, timeout_seconds=30, transport=transport)

        def forward(_, ctx):
            shard = tf.constant(x[starts[ctx.index] : starts[ctx.index + 1]])
            return {"normalized": towerlib.batch_norm(shard, ctx, name="bn", epsilon=1e-9)}

        towers, records = towerlib.build_towers(
            forward,
            lambda ctx: tf.zeros([shard_sizes[ctx.index]]),
            devices=devices,
            is_training=True,
            bn_mode="sync",
            cross_tower=reducer,
            require_loss=False,
        )
        reducer.check_consistent()
        stats = records.batch_norm["bn"]
        with tf.compat.v1.Session(config=towerlib.session_config(num_towers)) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            counts, means, variances, outputs = sess.run(
                [
                    [s.count for s in stats],
                    [s.mean for s in stats],
                    [s.variance for s in stats],
                    [t.outputs["normalized"] for t in towers],
                ]
            )
    x64 = x.astype(np.float64).reshape(-1, 3)
    want_mean, want_variance = x64.mean(0), x64.var(0)
    for tower in range(num_towers):
        assert counts[tower] == x64.shape[0]
        np.testing.assert_allclose(means[tower], want_mean, rtol=1e-7)
        np.testing.assert_allclose(variances[tower], want_variance, rtol=1e-5)
        assert np.all(variances[tower] > 0)
    # The towers' outputs together are the whole batch, normalized. They are
    # formed from small differences ((x - hi) * k + b), not as x * k + b: at
    # 1e4 / 0.02 = 5e5 standard deviations from 0, float32 would round x * k
    # by 0.03 standard deviations.
    normalized = np.concatenate(outputs).reshape(-1, 3).astype(np.float64)
    want_normalized = (x64 - want_mean) / np.sqrt(want_variance + 1e-9)
    np.testing.assert_allclose(normalized, want_normalized, atol=1e-4)


@pytest.mark.parametrize("transport", ["graph", "collective"])
@pytest.mark.parametrize("dtype,axis", [pytest.param("float16", -1, marks=HALF),
                                         ("float32", 1)])
def test_sync_statistics_for_half_precision_and_channels_first(dtype, axis, transport):
    """float16 inputs get float32 statistics; NCHW (axis=1) reduces N, H, W.

    The reference reads the same float16 values as float64, so only float32's sums
    differ (u = 2**-24 per addition over 108 values): float32's tolerances, not float16's.
    """
    rng = np.random.RandomState(1)
    shard_sizes = [3, 2]
    shape = [sum(shard_sizes), 4, 3, 3]  # channels at axis 1 or -1
    x = (5.0 + rng.randn(*shape)).astype(dtype)
    starts = np.cumsum([0, *shard_sizes])
    channel_axis = axis % len(shape)
    with tf.Graph().as_default():
        reducer = CrossTowerReducer(helpers.cpu_devices(2), transport=transport)

        def forward(_, ctx):
            shard = tf.constant(x[starts[ctx.index] : starts[ctx.index + 1]])
            return {"y": towerlib.batch_norm(shard, ctx, name="bn", axis=axis)}

        towers, records = towerlib.build_towers(
            forward,
            lambda ctx: tf.zeros([shard_sizes[ctx.index]]),
            devices=helpers.cpu_devices(2),
            is_training=True,
            bn_mode="sync",
            cross_tower=reducer,
            require_loss=False,
        )
        stats = records.batch_norm["bn"]
        with tf.compat.v1.Session(config=towerlib.session_config(2)) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            means, variances, outputs = sess.run(
                [
                    [s.mean for s in stats],
                    [s.variance for s in stats],
                    [t.outputs["y"] for t in towers],
                ]
            )
    axes = tuple(a for a in range(len(shape)) if a != channel_axis)
    x64 = x.astype(np.float64)
    for mean, variance in zip(means, variances):
        assert mean.dtype == np.float32 and mean.shape == (shape[channel_axis],)
        np.testing.assert_allclose(mean, x64.mean(axes), rtol=1e-6)
        np.testing.assert_allclose(variance, x64.var(axes), rtol=1e-5)
    assert outputs[0].dtype == np.dtype(dtype)
    assert outputs[0].shape == (shard_sizes[0], *shape[1:])


@pytest.mark.parametrize("transport", ["graph", "collective"])
@pytest.mark.parametrize(
    "center,scale,axis,dtype",
    [
        (True, True, -1, "float64"),
        (False, True, -1, "float64"),
        (True, False, 1, "float64"),
        (False, False, 1, "float64"),
        pytest.param(True, True, -1, "float16", marks=HALF),
    ],
)
def test_sync_gradients_match_one_device_for_inputs_gamma_and_beta(
        center, scale, axis, dtype, transport):
    """Forward and every gradient of sync batch norm, in float64, against
    tf.nn.moments + tf.nn.batch_normalization on the whole batch.

    Each tower differentiates its own loss sum(y_t * w_t); the gradient a
    tower gets for its shard must be that of the summed loss, and the
    towers' gamma and beta gradients must add up to the one-device ones.
    float16 inputs: statistics and gradients in float32, outputs and input
    gradients rounded to float16 (relative precision 5e-4).
    """
    half = dtype == "float16"
    rng = np.random.RandomState(3)
    shard_sizes = [4, 1, 3]
    num_towers = len(shard_sizes)
    shape = [sum(shard_sizes), 3, 2, 5] if axis == -1 else [sum(shard_sizes), 5, 3, 2]
    x = (2.0 + 3.0 * rng.randn(*shape)).astype(dtype).astype(np.float64)
    weights = rng.randn(*shape).astype(dtype).astype(np.float64)
    # The variables are float32: give the reference the same values.
    gamma_value = (1.0 + rng.rand(5)).astype(np.float32).astype(np.float64)
    beta_value = rng.randn(5).astype(np.float32).astype(np.float64)
    starts = np.cumsum([0, *shard_sizes])
    channel_axis = axis % len(shape)
    broadcast_shape = [5 if a == channel_axis else 1 for a in range(len(shape))]
    reduce_axes = [a for a in range(len(shape)) if a != channel_axis]

    with tf.Graph().as_default():
        reducer = CrossTowerReducer(helpers.cpu_devices(num_towers), transport=transport)
        shards = [
            tf.constant(x[starts[t] : starts[t + 1]].astype(dtype)) for t in range(num_towers)
        ]

        def forward(_, ctx):
            y = towerlib.batch_norm(
                shards[ctx.index], ctx, name="bn", axis=axis, center=center, scale=scale)
            shard_weights = weights[starts[ctx.index] : starts[ctx.index + 1]]
            return tf.reduce_sum(tf.cast(y, tf.float64) * shard_weights)

        towers, _ = towerlib.build_towers(
            forward, lambda ctx: tf.zeros([shard_sizes[ctx.index]]),
            devices=helpers.cpu_devices(num_towers), is_training=True, bn_mode="sync",
            cross_tower=reducer)
        params = tf.compat.v1.trainable_variables()
        grads = [
            tf.gradients(tower.loss, [shards[t]] + params) for t, tower in enumerate(towers)
        ]
        reducer.check_consistent()
        with tf.compat.v1.Session(config=towerlib.session_config(num_towers)) as sess:
            for var in params:
                var.load(gamma_value if "gamma" in var.op.name else beta_value, sess)
            losses, got = sess.run([[t.loss for t in towers], grads])
        param_names = [v.op.name.split("/")[-1] for v in params]

    with tf.Graph().as_default():
        inputs = tf.constant(x)
        gamma = tf.constant(gamma_value.reshape(broadcast_shape)) if scale else None
        beta = tf.constant(beta_value.reshape(broadcast_shape)) if center else None
        mean, variance = tf.nn.moments(inputs, reduce_axes, keepdims=True)
        y = tf.nn.batch_normalization(inputs, mean, variance, beta, gamma, 1e-3)
        loss = tf.reduce_sum(y * weights)
        wanted = [inputs] + [{"gamma": gamma, "beta": beta}[n] for n in param_names]
        with tf.compat.v1.Session() as sess:
            want_loss, want_y, want = sess.run([loss, y, tf.gradients(loss, wanted)])

    assert sorted(param_names) == sorted(["gamma"] * scale + ["beta"] * center)
    # float64: only rounding. float16 (u = 2**-11; x is the same float16 on both sides):
    # y is rounded once (u |y|), so the loss, a sum of y w, is within u sum|y w| (2 u with
    # float32's statistics and sums, whose own error is far below u); dx passes two roundings (the upstream
    # gradient cast to float16, dx itself): 2 u relative, 4 u of the largest |dx| where a
    # sum cancels; gamma's and beta's gradients, float32 sums of the float16 upstream
    # gradient (one rounding) times x - mean: 4 u relative for the same cancellation.
    u = half_precision.unit_roundoff("float16")
    loss_rtol, dx_atol, param_rtol = (0, 4 * u, 4 * u) if half else (1e-10, 1e-12, 5e-7)
    loss_atol = 2 * u * np.sum(np.abs(want_y * weights)) if half else 0
    np.testing.assert_allclose(sum(losses), want_loss, rtol=loss_rtol, atol=loss_atol)
    got_dx = np.concatenate([tower_grads[0] for tower_grads in got]).astype(np.float64)
    assert got_dx.dtype == np.float64 and got[0][0].dtype == np.dtype(dtype)
    np.testing.assert_allclose(
        got_dx, want[0], rtol=2 * u if half else 1e-9, atol=dx_atol * np.abs(want[0]).max())
    for i in range(len(params)):
        got_param = sum(tower_grads[1 + i] for tower_grads in got)
        # float64 path: rounded to float32 on the way to the float32 variables.
        np.testing.assert_allclose(got_param, want[1 + i].reshape(-1), rtol=param_rtol)


# This module's conv+dense model with sync batch norm on 2 CPU towers, one batch of 8.
build_sync_on_two_towers = functools.partial(
    helpers.build_on_image_batch, 2, conv_dense_model, bn_mode="sync")


def _exchange_ops(graph):
    """Names of the ops that move statistics between towers, either transport."""
    return {op.name for op in graph.get_operations()
            if op.type.startswith("Collective") or op.name.startswith("cross_tower_exchange")}


@pytest.mark.parametrize("transport", ["graph", "collective"])
def test_inference_uses_moving_statistics_without_collectives_on_one_tower(transport):
    with tf.Graph().as_default() as graph:
        data = helpers.image_batch(8)
        train = build_sync_on_two_towers(summaries=False, exchange=transport)
        collectives_before = _exchange_ops(graph)
        assert collectives_before  # the training graph has them
        captured = {}

        def evaluate(inputs, ctx):
            images, _ = inputs
            h = layers.conv2d(images, 4, 3, name="conv1", use_bias=False)
            captured["conv"] = h
            captured["bn"] = towerlib_batch_norm(h, ctx, "bn_conv1")
            return {"loss": conv_dense_model(inputs, ctx)}

        with tf.compat.v1.variable_scope("", reuse=True):
            towers, _ = towerlib.build_towers(
                evaluate,
                tuple(tf.constant(t) for t in data),
                num_towers=1,
                is_training=False,
                bn_mode="sync",
                reuse_variables=True,
            )
        assert _exchange_ops(graph) == collectives_before
        with tf.compat.v1.variable_scope("bn_conv1", reuse=True):
            moving_mean = tf.compat.v1.get_variable("moving_mean")
            moving_variance = tf.compat.v1.get_variable("moving_variance")
            gamma = tf.compat.v1.get_variable("gamma")
            beta = tf.compat.v1.get_variable("beta")
        with tf.compat.v1.Session(config=towerlib.session_config(2)) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(train.train_op)
            conv, bn, mean, variance, gamma, beta = sess.run(
                [captured["conv"], captured["bn"], moving_mean, moving_variance, gamma, beta]
            )
            sess.run(towers[0].loss)  # one tower alone runs: nothing to wait for
    assert not np.allclose(mean, 0.0)  # the step updated it
    np.testing.assert_allclose(
        bn, gamma * (conv - mean) / np.sqrt(variance + 1e-3) + beta, rtol=1e-4, atol=1e-5
    )


@pytest.mark.parametrize("extra_in_tower", [0, 1])
def test_towers_calling_batch_norm_differently_fail_at_build_time(extra_in_tower):
    start = time.time()
    with tf.Graph().as_default():
        data = helpers.image_batch(8)
        model = functools.partial(conv_dense_model, extra_batch_norm_in_tower=extra_in_tower)
        with pytest.raises(CollectiveMismatchError) as raised:
            towerlib.build_train_graph(
                model,
                tuple(tf.constant(t) for t in data),
                tf.compat.v1.train.GradientDescentOptimizer(0.1),
                devices=helpers.cpu_devices(2),
                bn_mode="sync",
            )
    message = str(raised.value)
    counts = (3, 2) if extra_in_tower == 0 else (2, 3)
    assert f"tower 0: {counts[0]}, tower 1: {counts[1]}" in message
    assert "'bn_fc1'" in message
    assert "same number of times" in message
    assert time.time() - start < 60


def test_sync_training_without_a_reducer_is_a_clear_error():
    with tf.Graph().as_default():
        with pytest.raises(ValueError, match="no cross-tower reducer"):
            towerlib.build_towers(
                conv_dense_model,
                tuple(tf.constant(t) for t in helpers.image_batch(4)),
                devices=helpers.cpu_devices(2),
                is_training=True,
                bn_mode="sync",
            )


def test_fetching_one_towers_loss_is_caught_before_running():
    with tf.Graph().as_default():
        train = build_sync_on_two_towers(exchange="collective")
        with pytest.raises(PartialFetchError, match=r"run 1 of the 2 ops.*tower_0/bn_conv1"):
            check_fetches(train.tower_losses[0])
        check_fetches([train.train_op, train.loss])  # every tower: fine


_PARTIAL_FETCH_SCRIPT = textwrap.dedent("""
    import time
    import tensorflow as tf
    import towerlib
    from towerlib.exchange import (CollectiveTimeoutError,
                                     bounded_session_config,
                                     explain_collective_errors)
    from tests.helpers import cpu_devices, image_batch
    from tests.batchnorm.test_sync_batch_norm import conv_dense_model
    with tf.Graph().as_default():
      data = image_batch(8)
      train = towerlib.build_train_graph(
          conv_dense_model, tuple(tf.constant(t) for t in data),
          tf.compat.v1.train.GradientDescentOptimizer(0.1),
          devices=cpu_devices(2), bn_mode='sync', exchange='collective')
      config = bounded_session_config(towerlib.session_config(2), timeout_seconds=2.0)
      with tf.compat.v1.Session(config=config) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        start = time.time()
        try:
          with explain_collective_errors():
            sess.run(train.tower_losses[0])   # tower 1 never runs
          print('NO ERROR')
        except CollectiveTimeoutError as error:
          print('ELAPSED', time.time() - start)
          print('MESSAGE', error.message.replace('\\n', ' '))
""")


@pytest.mark.slow  # runs its script in a fresh process
def test_running_one_towers_loss_ends_in_a_clear_error_within_a_bound():
    result = helpers.run_python_script(_PARTIAL_FETCH_SCRIPT)
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)
    assert "MESSAGE" in lines, result.stdout + result.stderr[-3000:]
    assert float(lines["ELAPSED"]) < 20.0
    assert "cross-tower collectives" in lines["MESSAGE"]
    assert "fetch the train op" in lines["MESSAGE"]


def test_through_the_graph_transport_one_towers_loss_runs_and_needs_no_check():
    """CPU towers exchange through graph edges by default: a run that fetches
    tower 0's loss runs tower 1's half too, so there is nothing to wait for."""
    with tf.Graph().as_default() as graph:
        train = build_sync_on_two_towers()
        assert _exchange_ops(graph)  # statistics do cross between the towers
        assert not [op for op in graph.get_operations() if op.type.startswith("Collective")]
        check_fetches(train.tower_losses[0])
        with tf.compat.v1.Session(config=towerlib.session_config(2)) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            losses = sess.run(train.tower_losses)
            assert sess.run(train.tower_losses[0]) == losses[0]


def test_variance_is_exact_when_a_shards_first_value_is_far_from_the_rest():
    """The per-shard pivot is the shard's first value: an outlier there (a zero
    corner among values of mean 1e4) must not cost precision."""
    rng = np.random.RandomState(0)
    images = (1e4 + 0.01 * rng.randn(8, 32, 32, 2)).astype(np.float32)
    images[0, 0, 0, :] = 0.0  # first value of tower 0's shard
    images[4, 0, 0, :] = 0.0  # first value of tower 1's shard

    def model(x, ctx):
        normalized = towerlib.batch_norm(x, ctx, name="bn", momentum=0.0)
        return tf.reduce_mean(tf.square(normalized)) + 0.0 * tf.reduce_sum(
            layers.dense(tf.ones([1, 1]), 1, name="unused_but_trainable"))

    with tf.Graph().as_default():
        train = towerlib.build_train_graph(
            model, tf.constant(images), tf.compat.v1.train.GradientDescentOptimizer(0.0),
            devices=helpers.cpu_devices(2), bn_mode="sync")
        variance = [v for v in tf.compat.v1.global_variables()
                    if v.op.name == "bn/moving_variance"][0]
        with tf.compat.v1.Session(config=towerlib.session_config(2)) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(train.train_op)
            got = session.run(variance)
    # rtol 2e-4: float32 sums of 4096 squares next to one of 1e8 round at that
    # level (a full-mean pivot gives the same 8e-5); subtracting n * offset^2
    # from raw squares instead would be off by ~20% here.
    np.testing.assert_allclose(got, images.astype(np.float64).var(axis=(0, 1, 2)),
                               rtol=2e-4)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_backward_keeps_no_float32_copy_of_half_precision_activations(dtype):
    """Between forward and backward, sync batch norm keeps what the backward
    reads. For float16 inputs that is the float16 input itself (x - hi is
    recomputed), not the float32 x - hi, which would double the memory."""
    with tf.Graph().as_default() as graph:
        reducer = CrossTowerReducer(helpers.cpu_devices(2))
        shards = [tf.ones([2, 3, 3, 4], dtype) * (i + 1) for i in range(2)]

        def forward(_, ctx):
            y = towerlib.batch_norm(shards[ctx.index], ctx, name="bn")
            return tf.reduce_sum(tf.cast(y, tf.float32))

        towers, _ = towerlib.build_towers(
            forward, lambda ctx: tf.zeros([2]), devices=helpers.cpu_devices(2),
            is_training=True, bn_mode="sync", cross_tower=reducer)
        for tower, shard in zip(towers, shards):
            tf.gradients(tower.loss, [shard])
    deviations = [
        op.outputs[0] for op in graph.get_operations()
        if op.type == "Sub" and op.outputs[0].shape.as_list() == [2, 3, 3, 4]
        and "gradients" not in op.name
    ]
    assert len(deviations) == 2  # one x - hi per tower
    read_by_backward = [
        consumer.name for tensor in deviations for consumer in tensor.consumers()
        if "gradients" in consumer.name
    ]
    assert bool(read_by_backward) == (dtype == "float32"), read_by_backward

"""Batch-norm moving statistics per bn_mode, against numpy (invariant 5)."""

import numpy as np
import pytest
import tensorflow as tf

import towerlib
from tests import half_precision, helpers
from towerlib import layers
from towerlib.batchnorm.statistics import BatchNormStatistics

MOMENTUM = 0.9
EPSILON = 1e-3
HALF = pytest.mark.half_precision


def bn_on_images_model(inputs, ctx):
    """Batch norm straight on [B, 6, 6, 2] images, so numpy knows its input."""
    images, labels = inputs
    h = towerlib.batch_norm(images, ctx, name="bn", momentum=MOMENTUM, epsilon=EPSILON)
    logits = layers.dense(layers.flatten(h), helpers.NUM_CLASSES, name="logits")
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=labels, logits=logits))


def train_and_read_moving_statistics(batch, num_towers, bn_mode, steps=1):
    graph = tf.Graph()
    with graph.as_default():
        train = towerlib.build_train_graph(
            bn_on_images_model, tuple(tf.constant(x) for x in batch),
            tf.compat.v1.train.GradientDescentOptimizer(0.1),
            devices=helpers.cpu_devices(num_towers), bn_mode=bn_mode)
        by_name = {v.op.name: v for v in tf.compat.v1.global_variables()}
        with tf.compat.v1.Session(config=towerlib.session_config(num_towers)) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            for _ in range(steps):
                session.run(train.train_op)
            return session.run([by_name["bn/moving_mean"], by_name["bn/moving_variance"]])


def expected_after_one_step(examples):
    """Moving statistics after one update from the start (mean 0, variance 1)."""
    mean = examples.mean(axis=(0, 1, 2))
    variance = examples.var(axis=(0, 1, 2))  # biased, as the layer records
    return (1 - MOMENTUM) * mean, 1 - (1 - MOMENTUM) * (1 - variance)


# Shards of 10 examples on 3 towers: 4, 3, 3.
BATCH = helpers.image_batch(10, seed=11, offset=2.0, scale=3.0)


def test_first_tower_uses_tower_zero_shard():
    moving_mean, moving_variance = train_and_read_moving_statistics(BATCH, 3, "first_tower")
    want_mean, want_variance = expected_after_one_step(BATCH[0][:4])
    np.testing.assert_allclose(moving_mean, want_mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(moving_variance, want_variance, rtol=1e-5, atol=1e-6)
    whole_mean, _ = expected_after_one_step(BATCH[0])
    assert np.abs(moving_mean - whole_mean).max() > 1e-3  # shard != whole batch here


def test_all_towers_uses_pooled_global_batch_in_one_update():
    moving_mean, moving_variance = train_and_read_moving_statistics(BATCH, 3, "all_towers")
    want_mean, want_variance = expected_after_one_step(BATCH[0])
    np.testing.assert_allclose(moving_mean, want_mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(moving_variance, want_variance, rtol=1e-5, atol=1e-6)


def test_all_towers_two_steps_are_two_updates_not_six():
    moving_mean, _ = train_and_read_moving_statistics(BATCH, 3, "all_towers", steps=2)
    mean = BATCH[0].mean(axis=(0, 1, 2))
    want = (1 - MOMENTUM ** 2) * mean  # two moving-average steps toward `mean`
    np.testing.assert_allclose(moving_mean, want, rtol=1e-5, atol=1e-6)


def test_all_towers_with_one_tower_equals_first_tower():
    first = train_and_read_moving_statistics(BATCH, 1, "first_tower")
    pooled = train_and_read_moving_statistics(BATCH, 1, "all_towers")
    np.testing.assert_allclose(first[0], pooled[0], rtol=1e-6)
    np.testing.assert_allclose(first[1], pooled[1], rtol=1e-6)


def test_pooled_statistics_are_exact_for_large_offsets():
    """Chan's combination: shards of mean 1e4 still pool to the exact variance."""
    rng = np.random.RandomState(0)
    shards = [1e4 + 0.01 * rng.randn(n, 3) for n in (5, 2, 7)]
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        statistics = [
            BatchNormStatistics(
                tower_index=i, count=tf.constant(float(len(s)), tf.float64),
                mean=tf.constant(s.mean(0)), variance=tf.constant(s.var(0)),
                moving_mean=None, moving_variance=None, momentum=MOMENTUM)
            for i, s in enumerate(shards)]
        count, mean, variance = session.run(towerlib.pooled_statistics(statistics))
    everything = np.concatenate(shards)
    assert count == len(everything)
    np.testing.assert_allclose(mean, everything.mean(0), rtol=1e-12)
    np.testing.assert_allclose(variance, everything.var(0), rtol=1e-6)


def test_inference_uses_moving_statistics():
    images = BATCH[0]
    with tf.Graph().as_default():
        x = tf.constant(images)
        ctx = towerlib.TowerContext.single(is_training=False)
        y = towerlib.batch_norm(x, ctx, name="bn", epsilon=EPSILON)
        by_name = {v.op.name: v for v in tf.compat.v1.global_variables()}
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            stats = {"moving_mean": np.array([1.0, -2.0], np.float32),
                     "moving_variance": np.array([4.0, 0.25], np.float32),
                     "gamma": np.array([2.0, 3.0], np.float32),
                     "beta": np.array([0.5, -0.5], np.float32)}
            for name, value in stats.items():
                by_name["bn/" + name].load(value, session)
            out = session.run(y)
            assert not tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)
    want = ((images - stats["moving_mean"]) / np.sqrt(stats["moving_variance"] + EPSILON)
            * stats["gamma"] + stats["beta"])
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_standalone_layer_puts_updates_in_update_ops():
    with tf.Graph().as_default():
        ctx = towerlib.TowerContext.single(is_training=True)
        towerlib.batch_norm(tf.constant(BATCH[0]), ctx, name="bn")
        updates = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)
        assert len(updates) == 2  # moving mean and moving variance


def test_nchw_channel_axis():
    images_nchw = np.transpose(BATCH[0], (0, 3, 1, 2))
    with tf.Graph().as_default():
        ctx = towerlib.TowerContext.single(is_training=True)
        y = towerlib.batch_norm(tf.constant(images_nchw), ctx, name="bn", axis=1,
                                epsilon=EPSILON)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            out = session.run(y)
    mean = images_nchw.mean(axis=(0, 2, 3), keepdims=True)
    variance = images_nchw.var(axis=(0, 2, 3), keepdims=True)
    np.testing.assert_allclose(out, (images_nchw - mean) / np.sqrt(variance + EPSILON),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("bn_mode, runs_per_step", [
    ("first_tower", 1), ("all_towers", 3)])
def test_user_update_ops_follow_the_mode(bn_mode, runs_per_step):
    """A user's own op in UPDATE_OPS: tower 0's only, or every tower's."""

    def model_with_counter(inputs, ctx):
        counter = tf.compat.v1.get_variable(
            "counter", [], initializer=tf.compat.v1.zeros_initializer(), trainable=False)
        tf.compat.v1.add_to_collection(
            tf.compat.v1.GraphKeys.UPDATE_OPS, counter.assign_add(1.0))
        return helpers.conv_dense_model(inputs, ctx)

    with tf.Graph().as_default():
        train = towerlib.build_train_graph(
            model_with_counter, tuple(tf.constant(x) for x in BATCH),
            tf.compat.v1.train.GradientDescentOptimizer(0.1),
            devices=helpers.cpu_devices(3), bn_mode=bn_mode)
        counter = [v for v in tf.compat.v1.global_variables() if v.op.name == "counter"][0]
        with tf.compat.v1.Session(config=towerlib.session_config(3)) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            for _ in range(2):
                session.run(train.train_op)
            assert session.run(counter) == 2 * runs_per_step


@pytest.mark.parametrize("dtype", ["float32", pytest.param("float16", marks=HALF)])
def test_shard_statistics_and_gradients_match_plain_tf(dtype):
    """The local modes' written-out batch norm against tf.nn.moments +
    tf.nn.batch_normalization and automatic differentiation, on one tower:
    outputs, every gradient (input, gamma, beta) and the recorded statistics."""
    rng = np.random.RandomState(4)
    x = (1.0 + 2.0 * rng.randn(5, 3, 4, 6)).astype(dtype)
    upstream = rng.randn(5, 3, 4, 6).astype(np.float32)
    with tf.Graph().as_default():
        ctx = towerlib.TowerContext.single(is_training=True)
        inputs = tf.constant(x)
        y = towerlib.batch_norm(inputs, ctx, name="bn", epsilon=EPSILON)
        variables = {v.op.name.split("/")[-1]: v for v in tf.compat.v1.trainable_variables()}
        loss = tf.reduce_sum(tf.cast(y, tf.float32) * upstream)
        got = tf.gradients(loss, [inputs, variables["gamma"], variables["beta"]])
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            variables["gamma"].load(np.linspace(0.5, 2.0, 6), session)
            variables["beta"].load(np.linspace(-1.0, 1.0, 6), session)
            got_y, got = session.run([y, got])

    with tf.Graph().as_default():
        inputs = tf.constant(x.astype(np.float64))
        gamma = tf.constant(np.linspace(0.5, 2.0, 6).astype(np.float32).astype(np.float64))
        beta = tf.constant(np.linspace(-1.0, 1.0, 6).astype(np.float32).astype(np.float64))
        mean, variance = tf.nn.moments(inputs, [0, 1, 2])
        y = tf.nn.batch_normalization(inputs, mean, variance, beta, gamma, EPSILON)
        want = tf.gradients(tf.reduce_sum(y * upstream), [inputs, gamma, beta])
        with tf.compat.v1.Session() as session:
            want_y, want = session.run([y, want])

    # float16, u = 2**-11 (both sides read the same float16 x; the statistics are float32):
    # y is rounded once (u |y|); dx passes two roundings (the upstream gradient cast to
    # float16, dx itself), gamma's and beta's gradients one (the upstream gradient), each
    # within its sum's largest term; 4 u = 2.0e-3 of the largest value bounds each with
    # room for float32's own sums. float32: those sums only.
    half = dtype == "float16"
    bound = 4 * half_precision.unit_roundoff("float16") if half else 1e-5
    np.testing.assert_allclose(got_y.astype(np.float64), want_y, rtol=bound, atol=bound)
    assert got[0].dtype == np.dtype(dtype)
    np.testing.assert_allclose(got[0].astype(np.float64), want[0],
                               atol=bound * np.abs(want[0]).max())
    for got_param, want_param in zip(got[1:], want[1:]):
        np.testing.assert_allclose(
            got_param, want_param, rtol=1e-5, atol=bound * np.abs(want_param).max())


def test_shard_outputs_stay_accurate_at_a_large_mean():
    """Outputs formed from x - hi: at a mean of 1e4 and a spread of 0.02, a
    normalization computed as x * k + b would be off by 0.03 standard deviations."""
    rng = np.random.RandomState(5)
    x = (1e4 + 0.02 * rng.randn(8, 4, 4, 3)).astype(np.float32)
    with tf.Graph().as_default():
        ctx = towerlib.TowerContext.single(is_training=True)
        y = towerlib.batch_norm(tf.constant(x), ctx, name="bn", epsilon=1e-9)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            got = session.run(y)
    x64 = x.astype(np.float64)
    want = (x64 - x64.mean((0, 1, 2))) / np.sqrt(x64.var((0, 1, 2)) + 1e-9)
    np.testing.assert_allclose(got, want, atol=1e-4)

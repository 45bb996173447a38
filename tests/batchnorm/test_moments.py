"""The batch-norm statistics and gradient as plain functions, against float64 numpy."""

import numpy as np
import pytest
import tensorflow as tf

from towerlib.batchnorm import moments

RNG = np.random.RandomState(7)


def _run(*tensors):
    with tf.compat.v1.Session() as session:
        return session.run(list(tensors))


def _summary(x, axes=(0, 1, 2)):
    x = tf.constant(x)
    broadcast = moments.ChannelBroadcast(4, 3, x.shape[-1])
    return moments.shard_summary(x, list(axes), broadcast, None,
                                 moments.static_count(x, list(axes)))


def test_the_docstrings_worked_example():
    with tf.Graph().as_default():
        shards = [np.array([1.0, 3.0]), np.array([5.0])]
        summaries = [_summary(s.reshape(-1, 1, 1, 1)) for s in shards]
        counts = tf.constant([[2.0], [1.0]], tf.float64)
        stack = lambda name: tf.stack([getattr(s, name) for s in summaries])  # noqa: E731
        total, mean, variance, mean_minus_hi = _run(*moments.combine_summaries(
            counts, stack("hi"), stack("lo"), stack("m2"), summaries[0].hi))
    assert total == 3.0 and mean == pytest.approx([3.0]) and variance == pytest.approx([8 / 3])
    assert mean_minus_hi == pytest.approx([2.0])  # mean 3 minus shard 0's pivot 1


@pytest.mark.parametrize("shift", [0.0, 1e4])
def test_shards_combined_give_the_whole_batchs_moments(shift):
    """Unequal and empty shards, a large mean: the pooled mean and variance of all rows."""
    sizes = [5, 0, 3, 8]
    data = [shift + RNG.normal(0, 0.02, size=(n, 2, 2, 3)).astype(np.float32) for n in sizes]
    with tf.Graph().as_default():
        summaries = [_summary(d) for d in data]
        counts = tf.constant([[float(n * 4)] for n in sizes], tf.float32)
        stack = lambda name: tf.stack([getattr(s, name) for s in summaries])  # noqa: E731
        total, mean, variance, _ = _run(*moments.combine_summaries(
            counts, stack("hi"), stack("lo"), stack("m2"), summaries[0].hi))
    whole = np.concatenate(data).astype(np.float64).reshape(-1, 3)
    assert total == whole.shape[0]
    # The mean to float32's resolution at its magnitude, the variance to ~1e-6 relative.
    np.testing.assert_allclose(mean, whole.mean(axis=0), rtol=0, atol=4e-7 * (shift + 0.02))
    np.testing.assert_allclose(variance, whole.var(axis=0), rtol=2e-5)


def test_gradient_is_the_one_device_batch_norm_gradient():
    """input_gradient with the shard's own sums equals autodiff of the textbook formula."""
    x = RNG.normal(3.0, 2.0, size=(6, 3, 2, 4))
    upstream = RNG.normal(size=x.shape)
    gamma, beta, epsilon = RNG.uniform(0.5, 2, 4), RNG.normal(size=4), 1e-3
    with tf.Graph().as_default():
        inputs = tf.constant(x)
        axes = [0, 1, 2]
        broadcast = moments.ChannelBroadcast(4, 3, 4)
        summary = moments.shard_summary(inputs, axes, broadcast, None, moments.static_count(
            inputs, axes))
        variance = moments.per_example(summary.m2, None, moments.static_count(inputs, axes))
        y, k, inverse_std = moments.normalize_from_summary(
            summary.deviation, summary.lo, variance, tf.constant(gamma), tf.constant(beta),
            epsilon, broadcast)
        sum_g, sum_g_x_hat = moments.local_gradient_sums(
            tf.constant(upstream), summary.deviation, inverse_std, summary.lo, axes)
        grad_x = moments.input_gradient(
            tf.constant(upstream), summary.deviation, k, inverse_std, summary.lo,
            tf.concat([sum_g, sum_g_x_hat], 0), tf.constant(float(x.size // 4), tf.float64),
            broadcast)
        mean, var = tf.nn.moments(inputs, axes)
        reference = (inputs - mean) * tf.math.rsqrt(var + epsilon) * gamma + beta
        (want_grad,) = tf.gradients(reference, [inputs], grad_ys=tf.constant(upstream))
        got_y, want_y, got_grad, want = _run(y, reference, grad_x, want_grad)
    np.testing.assert_allclose(got_y, want_y, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got_grad, want, rtol=1e-9, atol=1e-12)


def test_channels_first_broadcast():
    broadcast = moments.ChannelBroadcast(rank=4, channel_axis=1, channels=3)
    with tf.Graph().as_default():
        assert broadcast(tf.zeros([3])).shape.as_list() == [3, 1, 1]
    assert moments.ChannelBroadcast(4, 3, 3)(np.zeros(3)).shape == (3,)

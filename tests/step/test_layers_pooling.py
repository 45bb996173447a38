"""towerlib.layers' pooling: strides default to the pool size."""

import inspect

import pytest
import tensorflow as tf

from towerlib import layers


@pytest.mark.parametrize("pool", [layers.max_pool2d, layers.avg_pool2d])
def test_strides_default_to_the_pool_size(pool):
    assert inspect.signature(pool).parameters["strides"].default is None
    with tf.Graph().as_default():
        h = tf.zeros([2, 8, 12, 3])
        assert pool(h, 2).shape.as_list() == [2, 4, 6, 3]
        assert pool(h, (2, 3)).shape.as_list() == [2, 4, 4, 3]  # a (height, width) pool
        assert pool(h, 3, padding="VALID").shape.as_list() == [2, 2, 4, 3]
        assert pool(h, 3, strides=1).shape.as_list() == [2, 8, 12, 3]  # given: kept
        nchw = pool(tf.zeros([2, 3, 8, 12]), 2, data_format="NCHW")
        assert nchw.shape.as_list() == [2, 3, 4, 6]


@pytest.mark.parametrize("pool", [layers.max_pool2d, layers.avg_pool2d])
def test_default_strides_pool_non_overlapping_windows(pool):
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        x = tf.reshape(tf.range(16, dtype=tf.float32), [1, 4, 4, 1])
        got = session.run(pool(x, 2))[0, :, :, 0].tolist()
    expected = ([[5.0, 7.0], [13.0, 15.0]] if pool is layers.max_pool2d
                else [[2.5, 4.5], [10.5, 12.5]])
    assert got == expected

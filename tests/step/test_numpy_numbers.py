"""NumPy numbers are accepted wherever a Python number is."""

import numpy as np
import tensorflow as tf

import towerlib
from tests import helpers


def test_strategy_objects_take_numpy_numbers_as_python_ones():
    assert towerlib.Replicated(pack_bytes=np.int64(1024)) == towerlib.Replicated(1024)
    assert type(towerlib.Replicated(pack_bytes=np.int32(0)).pack_bytes) is int
    assert towerlib.CollectiveExchange(timeout_seconds=np.float32(2.5)).timeout_seconds == 2.5
    assert towerlib.WorkerGroup(np.int64(2), np.int64(1)) == towerlib.WorkerGroup(2, 1)
    assert towerlib.Float16(loss_scale=np.float64(1024)).loss_scale == 1024.0
    assert towerlib.ClipByGlobalNorm(np.float32(5)).clip_norm == 5.0
    assert towerlib.loss_scaling.DynamicLossScale(
        initial=np.float32(256), growth_interval=np.int64(10)).growth_interval == 10


def test_a_build_takes_numpy_tower_counts():
    with tf.Graph().as_default():
        train = helpers.build_on_image_batch(tower_fn=helpers.conv_bn_model,
                                             num_towers=np.int64(2), device_type="cpu")
        assert len(train.devices) == 2

"""A Keras model in half precision, one way: the build's precision= is Keras' mixed policy.

Held to tf_keras' own mixed-precision training on one device on the whole batch. The
tolerance is the compute dtype's: each product is rounded to 8 (bfloat16) or 11
(float16) bits, so a gradient carries a relative error of about 2**-8 or 2**-11 that
towerlib's towers and Keras' one device round differently (shards of the batch against
the whole); over 3 steps at rate 0.05 on weights of order 1 that is below 1e-3 and 5e-4.
Against float32 Keras the moving statistics miss by 3e-3 and 1e-3, so the tolerance on
them (1e-4, 3e-4) tells the precisions apart.
"""

import logging

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import towerlib
from tests.keras import keras_models as km
from tests.keras import keras_reference as kr
from tests.keras.test_keras_as_keras import CROSS_ENTROPY, conv_model

CASES = {"bfloat16": ("mixed_bfloat16", 1e-3, 1e-4), "float16": ("mixed_float16", 5e-4, 3e-4)}


@pytest.mark.parametrize("update", [towerlib.ParameterServer, towerlib.Replicated])
@pytest.mark.parametrize("dtype", sorted(CASES))
def test_half_precision_trains_as_keras_mixed_precision(dtype, update):
    policy, atol, statistics_atol = CASES[dtype]
    images, labels = km.batch(13)
    want = kr.keras_one_device(conv_model, images, labels, loss=CROSS_ENTROPY, steps=3,
                               policy=policy)
    got, variables = kr.towerlib_steps(towerlib.KerasTower(conv_model, CROSS_ENTROPY),
                                       images, labels, num_towers=2, update=update,
                                       steps=3, precision=dtype)
    kr.assert_weights_close(got, want, atol=atol, what=dtype)
    names = [name for name, _ in want]
    for name in ("bn/moving_mean:0", "bn/moving_variance:0"):
        index = names.index(name)
        np.testing.assert_allclose(got[index], want[index][1], atol=statistics_atol,
                                   err_msg=name)
    assert all(v.dtype == np.float32 for v in variables.values() if v.dtype.kind == "f")


def test_the_towers_compute_in_the_half_dtype():
    images, labels = km.batch(8)
    with tf.Graph().as_default() as graph:
        towerlib.build_train_graph(
            towerlib.KerasTower(conv_model, CROSS_ENTROPY),
            (tf.constant(images), tf.constant(labels)),
            tf.compat.v1.train.GradientDescentOptimizer(0.1), num_towers=2,
            precision=towerlib.BFloat16())
        forward = {op.name: op.get_attr("T").name for op in graph.get_operations()
                   if op.type in ("Conv2D", "MatMul") and op.name.startswith("tower_")
                   and "gradients" not in op.name}
    assert forward and set(forward.values()) == {"bfloat16"}, forward


def build(tower, precision, num_towers=2):
    images, labels = km.batch(8)
    return towerlib.build_train_graph(
        tower, (tf.constant(images), tf.constant(labels)),
        tf.compat.v1.train.GradientDescentOptimizer(0.1), num_towers=num_towers,
        precision=precision)


def test_a_float32_model_object_under_half_precision_names_the_one_way():
    with tf.Graph().as_default():
        with pytest.raises(TypeError, match=r"precision=BFloat16\(\) but the model .* "
                           r"give KerasTower a function that builds the model"):
            build(towerlib.KerasTower(conv_model(), CROSS_ENTROPY), "bfloat16")


def test_a_model_object_of_the_same_mixed_policy_is_honoured():
    with tf.Graph().as_default() as graph:
        with kr.keras_policy("mixed_bfloat16"):
            model = conv_model()
        build(towerlib.KerasTower(model, CROSS_ENTROPY), "bfloat16")
        types = {op.get_attr("T").name for op in graph.get_operations()
                 if op.type == "Conv2D" and op.name.startswith("tower_")}
    assert types == {"bfloat16"}


def test_a_mixed_policy_under_float32_precision_is_refused():
    with tf.Graph().as_default():
        with kr.keras_policy("mixed_bfloat16"):
            model = conv_model()
        with pytest.raises(TypeError, match=r"computes in bfloat16 .* Fix: "
                           r"precision=towerlib.BFloat16\(\)"):
            build(towerlib.KerasTower(model, CROSS_ENTROPY), "float32")


def own_tower(call_model):
    def tower(inputs, ctx):
        images, labels = inputs
        return tf.reduce_mean(km.sparse_cross_entropy(labels, call_model(images, ctx)))
    return tower


def test_your_own_tower_calling_a_float32_keras_model_under_bfloat16_is_refused():
    with tf.Graph().as_default():
        model = conv_model()
        tower = own_tower(lambda images, ctx: model(images, training=True))
        with pytest.raises(ValueError, match=r"precision=BFloat16\(\) but tower 0 computes "
                           r"every matmul and convolution in float32.*KerasTower"):
            build(tower, "bfloat16", num_towers=1)


def test_your_own_tower_calling_a_mixed_keras_model_under_float32_says_so(caplog):
    with tf.Graph().as_default(), caplog.at_level(logging.WARNING, logger="towerlib"):
        with kr.keras_policy("mixed_bfloat16"):
            model = conv_model()
        tower = own_tower(lambda images, ctx: model(images, training=True))
        build(tower, "float32", num_towers=1)
    lines = [r.getMessage() for r in caplog.records if "although the build's" in r.getMessage()]
    assert len(lines) == 1 and "in bfloat16" in lines[0], lines
    assert "precision=towerlib.BFloat16()" in lines[0]


@pytest.mark.parametrize("update", [towerlib.ParameterServer, towerlib.Replicated])
def test_your_own_tower_through_keras_outputs_computes_in_bfloat16(update):
    """The supported form in a tower function of your own, under either update."""
    with tf.Graph().as_default() as graph:
        keras_tower = towerlib.KerasTower(conv_model, None)
        tower = own_tower(keras_tower.outputs)
        images, labels = km.batch(8)
        towerlib.build_train_graph(
            tower, (tf.constant(images), tf.constant(labels)),
            tf.compat.v1.train.GradientDescentOptimizer(0.1), num_towers=2,
            precision="bfloat16", update=update())
        types = {op.get_attr("T").name for op in graph.get_operations()
                 if op.type in ("Conv2D", "MatMul") and op.name.startswith("tower_1/")
                 and "gradients" not in op.name}
    assert types == {"bfloat16"}


def test_a_final_layer_kept_in_float32_is_said_in_one_warning(caplog):
    def model_with_float32_head():
        inputs = tf_keras.Input((8, 8, 3))
        h = tf_keras.layers.Conv2D(4, 3, name="conv")(inputs)
        h = tf_keras.layers.GlobalAveragePooling2D()(h)
        return tf_keras.Model(inputs, tf_keras.layers.Dense(km.CLASSES, name="logits",
                                                            dtype="float32")(h))

    with tf.Graph().as_default(), caplog.at_level(logging.WARNING, logger="towerlib"):
        build(towerlib.KerasTower(model_with_float32_head, CROSS_ENTROPY), "bfloat16")
    lines = [r.getMessage() for r in caplog.records if "in float32" in r.getMessage()]
    assert len(lines) == 1 and "1 of 2 matmuls and convolutions" in lines[0], lines

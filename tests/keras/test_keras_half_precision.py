"""A Keras model in half precision, one way: the build's precision= is Keras' mixed policy.

Held to tf_keras' own mixed-precision training on one device on the whole batch, with
tolerances derived from the compute dtype's unit roundoff u (bfloat16: 8 significant
bits, u = 2**-8; float16: 11, u = 2**-11) and this computation (tests/half_precision.py,
docs/precision.md); the numbers below are this test's data.
"""

import logging

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import towerlib
from tests import half_precision
from tests.keras import keras_models as km
from tests.keras import keras_reference as kr
from tests.keras.test_keras_as_keras import CROSS_ENTROPY, conv_model

POLICIES = {"bfloat16": "mixed_bfloat16", "float16": "mixed_float16"}
STEPS = 3


def tolerances(dtype, images, motion):
    """(weights, moving mean, moving variance) atol for STEPS Momentum steps.

    Weights: each step's gradient within 16 u (16 roundings on its path, each may round
    differently in the towers' half batches than in Keras' whole batch), and the weights
    moved by `motion` (0.034) at most: 16 u * motion (tests/half_precision.py; bfloat16
    2.1e-3, float16 2.7e-4; measured 4.4e-4 and 4.6e-5 under both oneDNN settings).
    Moving statistics (momentum m = 0.9, from 0 and 1): step 1 reads the same weights.
    Steps 2 and 3 read float32 weights that differ (by the above) in bfloat16/float16, and
    one that sits at a rounding boundary is read one ulp apart; such a flip of the largest
    conv weight (0.69) moves its channel's batch mean by ulp(0.69) * mean(x) and its
    variance by up to 2 ulp(0.69) std(x) std(y), and those two steps weigh (1 - m) (1 + m)
    = 0.19 in the moving statistics. bfloat16: mean 0.19 * 2**-8 * 2.23 = 1.7e-3, variance
    0.19 * 2 * 2**-8 * 2.09 * 3.58 = 1.1e-2; float16: 2.1e-4 and 1.4e-3 (measured:
    bfloat16 3.3e-4 and 5.0e-4, float16 8.9e-5 and 1.2e-4).
    """
    m = 0.9
    kernel = km.initial_weights()["conv/kernel"]
    flip = half_precision.ulp(np.max(np.abs(kernel)), dtype)
    outputs = tf.nn.conv2d(images, kernel, 1, "VALID").numpy()
    late_steps = (1 - m) * (1 + m)
    return (half_precision.trained_atol(dtype, motion),
            late_steps * flip * float(np.max(images.mean(axis=(0, 1, 2)))),
            late_steps * 2 * flip * float(np.max(images.std(axis=(0, 1, 2)))
                                          * np.max(outputs.std(axis=(0, 1, 2)))))


# Where the derived tolerance stays below the float32 gap (measured: bfloat16 variance
# 1.9e-2 against 1.1e-2, float16 mean 4.9e-4 against 2.1e-4), the test also checks that
# the towers are not float32. The other statistic's gap is within its tolerance (bfloat16
# mean 1.9e-3 against 1.7e-3, too thin to claim; float16 variance 9.6e-4 against 1.4e-3),
# and so are the weights' (3.7e-4 and 5e-5): they cannot tell the precisions apart.
TELLS_FLOAT32_APART = {"bfloat16": "bn/moving_variance:0", "float16": "bn/moving_mean:0"}


@pytest.mark.half_precision
@pytest.mark.parametrize("update", [towerlib.ParameterServer, towerlib.Replicated])
@pytest.mark.parametrize("dtype", sorted(POLICIES))
def test_half_precision_trains_as_keras_mixed_precision(dtype, update):
    images, labels = km.batch(13)
    want = kr.keras_one_device(conv_model, images, labels, loss=CROSS_ENTROPY, steps=STEPS,
                               policy=POLICIES[dtype])
    full = kr.keras_one_device(conv_model, images, labels, loss=CROSS_ENTROPY, steps=STEPS)
    got, variables = kr.towerlib_steps(towerlib.KerasTower(conv_model, CROSS_ENTROPY),
                                       images, labels, num_towers=2, update=update,
                                       steps=STEPS, precision=dtype)
    initial = km.initial_weights()
    names = [name for name, _ in want]
    motion = max(float(np.max(np.abs(value - initial[name.split(":")[0]])))
                 for name, value in want if "moving" not in name)
    atol, mean_atol, variance_atol = tolerances(dtype, images, motion)
    kr.assert_weights_close(got, want, atol=atol, what=dtype)
    for name, statistics_atol in (("bn/moving_mean:0", mean_atol),
                                  ("bn/moving_variance:0", variance_atol)):
        index = names.index(name)
        np.testing.assert_allclose(got[index], want[index][1], atol=statistics_atol,
                                   err_msg=name)
        if name == TELLS_FLOAT32_APART[dtype]:
            gap = float(np.max(np.abs(got[index] - full[index][1])))
            assert gap > statistics_atol, f"{name}: {gap:.3g} from float32 Keras"
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

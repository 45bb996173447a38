"""What a Keras user meets at the edges, refused in one line naming the fix: a model
function under another global half-precision policy, a model all frozen, sparse inputs."""

import pytest
import tensorflow as tf
import tf_keras

import towerlib
from tests.keras import keras_models as km


def build(model, inputs=None, **options):
    images, labels = km.batch(8)
    return towerlib.build_train_graph(
        towerlib.KerasTower(model, km.sparse_cross_entropy),
        inputs or (tf.constant(images), tf.constant(labels)),
        tf.compat.v1.train.GradientDescentOptimizer(0.1), num_towers=2, **options)


def test_a_model_function_under_global_mixed_bfloat16_with_float16_is_refused():
    tf_keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        with tf.Graph().as_default(), pytest.raises(
                towerlib.KerasTowerError, match=r"global policy is 'mixed_bfloat16' but the "
                r"build's precision is Float16\(\).*Fix: precision=towerlib.BFloat16\(\)"):
            build(km.keras_functional, precision=towerlib.Float16())
    finally:
        tf_keras.mixed_precision.set_global_policy("float32")


def test_an_all_frozen_model_is_refused_naming_its_frozen_weights_and_the_fix():
    def frozen():
        model = km.keras_functional()
        for layer in model.layers:
            layer.trainable = False
        return model

    with tf.Graph().as_default(), pytest.raises(
            towerlib.KerasTowerError, match=r"every weight of the model .* is frozen .*"
            r"conv/kernel.*Fix: unfreeze the layers to train"):
        build(frozen)


@pytest.mark.parametrize("kind", ["sparse", "ragged"])
@pytest.mark.parametrize("given", ["global batch", "input function"])
def test_sparse_and_ragged_inputs_are_refused_in_one_line(kind, given):
    def features():
        if kind == "sparse":
            return tf.sparse.from_dense(tf.ones([8, 4]))
        return tf.RaggedTensor.from_row_lengths(tf.ones([16]), [2] * 8)

    labels = tf.zeros([8], tf.int32)
    name = "SparseTensor" if kind == "sparse" else "RaggedTensor"
    with tf.Graph().as_default(), pytest.raises(
            TypeError, match=rf"An input is a {name}.*Fix: make it dense"):
        inputs = (features(), labels)
        if given == "input function":
            towerlib.build_train_graph(
                lambda batch, ctx: tf.reduce_mean(tf.cast(batch[1], tf.float32)),
                lambda ctx: (features(), tf.zeros([4], tf.int32)),
                tf.compat.v1.train.GradientDescentOptimizer(0.1), num_towers=2)
        else:
            build(km.keras_functional, inputs)

"""Keras cases a review found broken: activity regularizers and add_loss on functional
models, a model called twice or sharing layers, half precisions and Keras policies, a
training tensor under accumulation, a model built inside a plain tower function."""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import towerlib
from tests.keras import keras_models as km

KERNEL = np.random.RandomState(4).randn(4, 3).astype(np.float32) * 0.5


def dense_model(activity=0.0, add_loss=0.0, name="d"):
    """x [n, 4] -> Dense 3 with an L2 kernel regularizer (0.5), an optional activity term."""
    inputs = tf_keras.Input((4,))
    layer = tf_keras.layers.Dense(
        3, use_bias=False, name=name,
        kernel_initializer=tf_keras.initializers.Constant(KERNEL),
        kernel_regularizer=tf_keras.regularizers.l2(0.5),
        activity_regularizer=tf_keras.regularizers.l2(activity) if activity else None)
    outputs = layer(inputs)
    model = tf_keras.Model(inputs, outputs)
    if add_loss:
        model.add_loss(add_loss * tf.reduce_mean(tf.square(outputs)))
    return model


def mean_square(labels, outputs):
    return tf.reduce_mean(tf.square(outputs - labels), axis=1)


def data(n=10):
    rng = np.random.RandomState(1)
    return rng.randn(n, 4).astype(np.float32), rng.randn(n, 3).astype(np.float32)


def run(tower, num_towers, update=None, steps=2, **options):
    x, y = data()
    with tf.Graph().as_default():
        train = towerlib.build_train_graph(
            tower(), (tf.constant(x), tf.constant(y)),
            tf.compat.v1.train.GradientDescentOptimizer(0.1), num_towers=num_towers,
            update=update or towerlib.ParameterServer(), **options)
        (kernel,) = [v for v in tf.compat.v1.global_variables() if v.op.name == "d/kernel"]
        with tf.compat.v1.Session(config=towerlib.session_config(num_towers)) as session:
            train.initialize(session)
            first = session.run([train.loss, train.regularization_loss])
            for _ in range(steps):
                session.run(train.train_op)
            return first, session.run(kernel)


def expected_first(activity=0.0, add_loss=0.0):
    """(data loss, regularization) before the first step, by definition on one device."""
    x, y = data()
    out = x @ KERNEL
    data_loss = np.mean(np.mean((out - y) ** 2, axis=1))
    regularization = 0.5 * np.sum(KERNEL ** 2)
    regularization += activity * np.sum(out ** 2) / len(x)  # Keras: per-example mean
    regularization += add_loss * np.mean(out ** 2)
    return data_loss, regularization


@pytest.mark.parametrize("update", [towerlib.ParameterServer, towerlib.Replicated])
@pytest.mark.parametrize("terms", [dict(activity=0.2), dict(add_loss=0.3)])
def test_activity_and_add_loss_terms_count_as_on_one_device(update, terms):
    want = expected_first(**terms)
    results = []
    # With accumulation too: a functional model's symbolic add_loss now runs in the
    # accumulation loop's body (built from the model held at construction).
    runs = ((1, 1), (2, 1), (3, 1), (2, 2))
    for towers, k in runs:
        first, kernel = run(lambda: towerlib.KerasTower(lambda: dense_model(**terms),
                                                        mean_square),
                            towers, update(), accumulation_steps=k)
        if k == 1:
            np.testing.assert_allclose(first, want, rtol=1e-5)
        results.append(kernel)
    for kernel in results[1:]:
        np.testing.assert_allclose(kernel, results[0], atol=1e-6)


def test_a_model_called_twice_in_a_tower_counts_its_weights_once():
    class TwoHalves(towerlib.KerasTower):
        def build(self, inputs, ctx):
            x, y = inputs
            half = tf.shape(x)[0] // 2
            a = self.outputs(x[:half], ctx)
            b = self.outputs(x[half:], ctx)
            return tf.reduce_mean(mean_square(y, tf.concat([a, b], 0)))

    first, _ = run(lambda: TwoHalves(dense_model, mean_square), 2)
    assert first[1] == pytest.approx(expected_first()[1], rel=1e-6)


def test_a_keras_mixed_precision_policy_is_refused_in_one_line():
    tf_keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        with pytest.raises(towerlib.KerasTowerError, match="mixed-precision policy"):
            run(lambda: towerlib.KerasTower(dense_model, mean_square), 2)
    finally:
        tf_keras.mixed_precision.set_global_policy("float32")


def test_a_training_tensor_under_accumulation_is_refused():
    images, labels = km.batch(8)
    with tf.Graph().as_default():
        model = km.keras_functional()
        switch = tf.compat.v1.placeholder_with_default(True, [])

        def tower(inputs, ctx):
            x, y = inputs
            return tf.reduce_mean(km.sparse_cross_entropy(y, model(x, training=switch)))

        with pytest.raises(towerlib.KerasBatchNormError, match="accumulation loop"):
            towerlib.build_train_graph(
                tower, (tf.constant(images), tf.constant(labels)), km.optimizer("momentum"),
                num_towers=2, accumulation_steps=2)


@pytest.mark.parametrize("num_towers", [1, 2])
def test_a_model_built_inside_a_plain_tower_function_trains_its_statistics(num_towers):
    images, labels = km.batch(8)
    with tf.Graph().as_default():
        models = []

        def tower(inputs, ctx):
            x, y = inputs
            if not models:  # built in tower 0, reused by the others
                models.append(km.keras_functional())
            return tf.reduce_mean(km.sparse_cross_entropy(y, models[0](x, training=True)))

        train = towerlib.build_train_graph(
            tower, (tf.constant(images), tf.constant(labels)), km.optimizer("momentum"),
            num_towers=num_towers, bn_mode="all_towers")
        with tf.compat.v1.Session(config=towerlib.session_config(num_towers)) as session:
            train.initialize(session)
            session.run(train.train_op)
            moving_mean = session.run(models[0].get_layer("bn").moving_mean)
    assert np.abs(moving_mean).max() > 1e-3

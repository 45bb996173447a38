"""tf_keras models as tower functions: every bn_mode, both updates, against one device
and against towerlib's own batch norm on the same network and numbers."""

import numpy as np
import pytest
import tensorflow as tf

import towerlib
from tests.keras import keras_models as km

MODES = ["first_tower", "all_towers", "sync"]
UPDATES = {"ps": towerlib.ParameterServer, "replicated": towerlib.Replicated}


def keras_tower():
    return towerlib.KerasTower(km.keras_functional(), km.sparse_cross_entropy)


def model_values(values):
    return {k: v for k, v in values.items() if k != "global_step"}


def without_moving_variance(values):
    """The Keras layer's moving variance is tf_keras' own (Bessel-corrected, as its fused
    kernel), towerlib.batch_norm's the biased one: held to tf_keras in
    test_keras_as_keras, left out where the two networks are compared."""
    return {k: v for k, v in model_values(values).items() if "moving_variance" not in k}


def assert_close(got, want, atol=1e-5, what=""):
    assert sorted(got) == sorted(want), what
    worst = max((float(np.max(np.abs(got[k] - want[k]))), k) for k in want)
    assert worst[0] <= atol, f"{what}: {worst[1]} differs by {worst[0]}"


@pytest.mark.parametrize("bn_mode", MODES)
@pytest.mark.parametrize("update", sorted(UPDATES))
@pytest.mark.parametrize("num_towers,optimizer_kind", [(2, "momentum"), (4, "adam")])
def test_keras_model_trains_as_towerlibs_batch_norm_does(bn_mode, update, num_towers,
                                                         optimizer_kind):
    """Weights, slots and moving statistics after 5 steps on an uneven global batch (13)
    equal the same network written with towerlib.batch_norm, in the same mode."""
    images, labels = km.batch(13)
    options = dict(num_towers=num_towers, bn_mode=bn_mode, update=UPDATES[update](),
                   optimizer_kind=optimizer_kind)
    got, got_reg, copies = km.train(keras_tower, images, labels, **options)
    want, want_reg, _ = km.train(km.towerlib_tower, images, labels, **options)
    assert_close(without_moving_variance(got), without_moving_variance(want),
                 what=f"{bn_mode} {update}")
    np.testing.assert_allclose(got_reg, want_reg, rtol=1e-5)
    assert np.abs(got["bn/moving_mean"]).max() > 1e-3  # the statistics moved
    for name, value in copies.items():  # every replicated copy equals tower 0's
        plain = name.split("/", 2)[2]
        np.testing.assert_array_equal(value, got[plain], err_msg=name)


@pytest.mark.parametrize("update", sorted(UPDATES))
def test_sync_keras_model_on_towers_equals_one_device(update):
    images, labels = km.batch(11)
    one, _, _ = km.train(keras_tower, images, labels, num_towers=1, bn_mode="sync",
                         update=towerlib.ParameterServer(), optimizer_kind="momentum")
    for towers in (2, 3):
        got, _, _ = km.train(keras_tower, images, labels, num_towers=towers, bn_mode="sync",
                             update=UPDATES[update](), optimizer_kind="momentum")
        assert_close(model_values(got), model_values(one), what=f"{towers} towers")


def test_regularization_counts_once_whatever_the_towers():
    images, labels = km.batch(12)
    kernel = km.initial_weights()["conv/kernel"]
    for towers in (1, 2, 4):
        _, reg, _ = km.train(keras_tower, images, labels, num_towers=towers,
                             bn_mode="first_tower", update=towerlib.ParameterServer(),
                             optimizer_kind="momentum", steps=1)
        # Before the first update: exactly one L2 term of the initial kernel.
        np.testing.assert_allclose(reg[0], km.L2 * np.sum(kernel.astype(np.float64) ** 2),
                                   rtol=1e-5)


def _conv_outputs(images):
    weights = km.initial_weights()
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        return session.run(tf.nn.conv2d(images, weights["conv/kernel"], 1, "VALID")
                           + weights["conv/bias"])


@pytest.mark.parametrize("bn_mode", MODES)
def test_a_keras_batch_norm_moves_the_moving_mean_by_the_modes_definition(bn_mode):
    """A plain tower function calling a shared Sequential-style model, training=True."""
    images, labels = km.batch(10)
    with tf.Graph().as_default():
        model = km.keras_functional(momentum=0.9)

        def tower(inputs, ctx):
            x, y = inputs
            return tf.reduce_mean(km.sparse_cross_entropy(y, model(x, training=True)))

        train = towerlib.build_train_graph(
            tower, (tf.constant(images), tf.constant(labels)),
            tf.compat.v1.train.GradientDescentOptimizer(0.1), num_towers=2, bn_mode=bn_mode)
        with tf.compat.v1.Session(config=towerlib.session_config(2)) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(train.train_op)
            moving_mean = session.run(model.get_layer("bn").moving_mean)
    conv = _conv_outputs(images)
    used = conv[:5] if bn_mode == "first_tower" else conv  # tower 0 has examples 0-4
    expected = 0.1 * used.mean(axis=(0, 1, 2))  # 0.9 * 0 + 0.1 * batch mean
    np.testing.assert_allclose(moving_mean, expected, rtol=1e-5, atol=1e-6)


def test_evaluation_uses_the_moving_statistics_on_every_tower():
    images, labels = km.batch(9)
    with tf.Graph().as_default():
        tower = keras_tower()
        batch = (tf.constant(images), tf.constant(labels))
        train = towerlib.build_train_graph(
            tower, batch, km.optimizer("momentum"), num_towers=2, bn_mode="sync")
        evaluation = towerlib.build_eval_graph(tower, batch, num_towers=3, reuse_variables=True)
        model = tower.model()
        with tf.compat.v1.Session(config=towerlib.session_config(3)) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(tf.compat.v1.local_variables_initializer())
            for _ in range(3):
                session.run(train.train_op)
            session.run(evaluation.update_op)
            precision = session.run(evaluation.values["correct"])
            weights = {w.op.name: session.run(w) for w in model.weights}
    # The inference forward pass in NumPy, with the moving statistics.
    conv = _numpy_conv(images, weights["conv/kernel"]) + weights["conv/bias"]
    bn = (conv - weights["bn/moving_mean"]) / np.sqrt(weights["bn/moving_variance"] + 1e-3)
    bn = bn * weights["bn/gamma"] + weights["bn/beta"]
    logits = np.maximum(bn, 0).mean(axis=(1, 2)) @ weights["logits/kernel"] + weights[
        "logits/bias"]
    assert weights["bn/moving_variance"].min() != 1.0  # trained statistics, not the initial
    assert precision == pytest.approx(np.mean(logits.argmax(1) == labels))


def _numpy_conv(images, kernel):
    n, height, width, _ = images.shape
    out = np.zeros((n, height - 2, width - 2, kernel.shape[-1]), np.float64)
    for i in range(3):
        for j in range(3):
            out += np.einsum("nhwc,cd->nhwd", images[:, i:i + height - 2, j:j + width - 2],
                             kernel[i, j])
    return out


@pytest.mark.parametrize("update", sorted(UPDATES))
def test_accumulated_keras_steps_equal_towerlibs_batch_norm(update):
    """k = 2 micro-batches: the model is called in the accumulation loop's body."""
    images, labels = km.batch(12)
    for bn_mode in ("all_towers", "sync"):
        graphs = []
        for make in (keras_tower, km.towerlib_tower):
            graphs.append(_accumulated(make, images, labels, UPDATES[update](), bn_mode))
        assert_close(without_moving_variance(graphs[0]), without_moving_variance(graphs[1]),
                     what=f"k=2 {bn_mode} {update}")


def _accumulated(make, images, labels, update, bn_mode):
    with tf.Graph().as_default():
        train = towerlib.build_train_graph(
            make(), (tf.constant(images), tf.constant(labels)), km.optimizer("momentum"),
            num_towers=2, bn_mode=bn_mode, update=update, accumulation_steps=2)
        variables = {v.op.name: v for v in tf.compat.v1.global_variables()}
        with tf.compat.v1.Session(config=towerlib.session_config(2)) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(tf.compat.v1.local_variables_initializer())
            for _ in range(3):
                session.run(train.train_op)
            return session.run(variables)

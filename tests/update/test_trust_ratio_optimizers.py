"""LARS and LAMB against NumPy implementations of the papers' updates, and N towers
against one device (the trust ratio is the global gradient's)."""

import numpy as np
import pytest
import tensorflow as tf

import towerlib
from tests import helpers

RNG = np.random.RandomState(3)
X = RNG.randn(10, 4)
Y = RNG.randn(10, 3)
W0 = RNG.randn(4, 3) * 0.5
B0 = RNG.randn(3) * 0.1
STEPS = 4


def numpy_gradients(w, b):
    """Of the mean squared error 0.5 * mean_n sum_j (x w + b - y)^2."""
    residual = X @ w + b - Y
    return X.T @ residual / len(X), residual.mean(axis=0)


def numpy_lars(rate, momentum, wd, eta):
    w, b, vw, vb = W0.copy(), B0.copy(), np.zeros_like(W0), np.zeros_like(B0)
    for _ in range(STEPS):
        gw, gb = numpy_gradients(w, b)
        w_norm, g_norm = np.linalg.norm(w), np.linalg.norm(gw)
        trust = eta * w_norm / (g_norm + wd * w_norm)
        vw = momentum * vw + rate * trust * (gw + wd * w)
        vb = momentum * vb + rate * gb  # rank 1: excluded
        w, b = w - vw, b - vb
    return w, b


def numpy_lamb(rate, beta1, beta2, eps, wd):
    w, b = W0.copy(), B0.copy()
    moments = {"w": [np.zeros_like(w), np.zeros_like(w)], "b": [np.zeros_like(b)] * 2}
    for t in range(1, STEPS + 1):
        gw, gb = numpy_gradients(w, b)
        new = {}
        for key, value, grad in (("w", w, gw), ("b", b, gb)):
            m, v = moments[key]
            m = beta1 * m + (1 - beta1) * grad
            v = beta2 * v + (1 - beta2) * grad ** 2
            moments[key] = [m, v]
            direction = (m / (1 - beta1 ** t)) / (np.sqrt(v / (1 - beta2 ** t)) + eps)
            if key == "w":
                direction = direction + wd * value
                direction = np.linalg.norm(value) / np.linalg.norm(direction) * direction
            new[key] = value - rate * direction
        w, b = new["w"], new["b"]
    return w, b


def linear_tower(inputs, ctx):
    x, y = inputs
    # Initializers, not tensors: with accumulation the towers build inside a loop's body.
    w = tf.compat.v1.get_variable("w", W0.shape, initializer=tf.constant_initializer(W0))
    b = tf.compat.v1.get_variable("b", B0.shape, initializer=tf.constant_initializer(B0))
    return tf.reduce_mean(0.5 * tf.reduce_sum(tf.square(tf.matmul(x, w) + b - y), axis=1))


OPTIMIZERS = {
    "lars": (lambda: towerlib.optimizers.LARSOptimizer(0.5, 0.9, weight_decay=0.01, eta=0.02),
             lambda: numpy_lars(0.5, 0.9, 0.01, 0.02)),
    "lamb": (lambda: towerlib.optimizers.LAMBOptimizer(0.05, 0.9, 0.99, 1e-6, 0.01),
             lambda: numpy_lamb(0.05, 0.9, 0.99, 1e-6, 0.01)),
}


def train(name, num_towers, update, **options):
    with tf.Graph().as_default():
        batch = (tf.constant(X, tf.float32), tf.constant(Y, tf.float32))
        step = towerlib.build_train_graph(linear_tower, batch, OPTIMIZERS[name][0](),
                                          num_towers=num_towers, update=update, **options)
        with tf.compat.v1.Session(config=towerlib.session_config(num_towers)) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(tf.compat.v1.local_variables_initializer())
            for _ in range(STEPS):
                session.run(step.train_op)
            values = {v.op.name: session.run(v) for v in tf.compat.v1.global_variables()}
            copies = {v.op.name: session.run(v) for v in tf.compat.v1.local_variables()
                      if v.op.name.startswith("replicated/")}
    return values, copies


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_one_device_follows_the_papers_update(name):
    values, _ = train(name, 1, towerlib.ParameterServer())
    want_w, want_b = OPTIMIZERS[name][1]()
    np.testing.assert_allclose(values["w"], want_w, atol=1e-5)
    np.testing.assert_allclose(values["b"], want_b, atol=1e-5)


@pytest.mark.parametrize("update", [towerlib.ParameterServer, towerlib.Replicated])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_towers_take_one_devices_step(name, update):
    one, _ = train(name, 1, towerlib.ParameterServer())
    for towers in (2, 3):  # 10 rows over 3 towers: uneven
        got, copies = train(name, towers, update())
        assert helpers.max_abs_difference(got, one) < 1e-6
        for copy, value in copies.items():
            np.testing.assert_array_equal(value, got[copy.split("/", 2)[2]], err_msg=copy)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_accumulated_micro_batches_take_one_devices_step(name):
    one, _ = train(name, 1, towerlib.ParameterServer())
    got, _ = train(name, 2, towerlib.Replicated(), accumulation_steps=2)
    assert helpers.max_abs_difference(got, one) < 1e-6


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_sparse_gradients_apply_as_their_dense_value(name):
    def embedding(inputs, ctx):  # repeated ids: a sparse gradient with duplicate rows
        ids, labels = inputs
        table = tf.compat.v1.get_variable("table", initializer=tf.constant(RNG_TABLE))
        logits = tf.reduce_mean(tf.gather(table, ids), axis=1)[:, :3]
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=labels, logits=logits))

    def dense(inputs, ctx):  # the same, its gradient dense
        ids, labels = inputs
        table = tf.compat.v1.get_variable("table", initializer=tf.constant(RNG_TABLE))
        logits = tf.reduce_mean(tf.matmul(tf.one_hot(ids, 20), table), axis=1)[:, :3]
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=labels, logits=logits))

    results = []
    for tower in (embedding, dense):
        with tf.Graph().as_default():
            ids, labels = helpers.id_batch(8)
            step = towerlib.build_train_graph(
                tower, (tf.constant(ids), tf.constant(labels)), OPTIMIZERS[name][0](),
                num_towers=2)
            grads = [g for g, _ in step.grads_and_vars]
            (table,) = [v for v in tf.compat.v1.global_variables() if v.op.name == "table"]
            with tf.compat.v1.Session(config=towerlib.session_config(2)) as session:
                session.run(tf.compat.v1.global_variables_initializer())
                for _ in range(3):
                    session.run(step.train_op)
                results.append((session.run(table), grads))
    assert isinstance(results[0][1][0], tf.IndexedSlices)
    assert not isinstance(results[1][1][0], tf.IndexedSlices)
    assert np.abs(results[0][0] - RNG_TABLE).max() > 1e-3  # it trained
    np.testing.assert_allclose(results[0][0], results[1][0], atol=1e-6)


RNG_TABLE = np.random.RandomState(5).randn(20, 4).astype(np.float32)


def test_bad_hyperparameters_are_one_line():
    for make in (lambda: towerlib.optimizers.LARSOptimizer(0.1, momentum=1.0),
                 lambda: towerlib.optimizers.LAMBOptimizer(0.1, beta1=1.5),
                 lambda: towerlib.optimizers.LAMBOptimizer(0.1, weight_decay=-1)):
        with pytest.raises(ValueError):
            make()


def numpy_lars_trust(w, g, wd, eta):
    """tf.contrib's and apex's convention: 1 unless both norms are > 0."""
    w_norm, g_norm = np.linalg.norm(w), np.linalg.norm(g)
    return eta * w_norm / (g_norm + wd * w_norm) if w_norm > 0 and g_norm > 0 else 1.0


def numpy_lars_steps(w, gradients, rate, momentum, wd, eta):
    velocity = np.zeros_like(w)
    for g in gradients:
        velocity = momentum * velocity + rate * numpy_lars_trust(w, g, wd, eta) * (g + wd * w)
        w = w - velocity
    return w


@pytest.mark.parametrize("start, gradients", [
    (np.zeros((4, 3)), [RNG.randn(4, 3)] * 3),                       # ||w|| = 0 at first
    (RNG.randn(4, 3), [np.zeros((4, 3)), RNG.randn(4, 3), np.zeros((4, 3))]),  # ||g|| = 0
    (RNG.randn(4, 3), [RNG.randn(4, 3) for _ in range(3)]),         # both > 0
], ids=["zero_weights", "zero_gradient", "both_positive"])
def test_lars_trust_is_one_when_a_norm_is_zero(start, gradients):
    with tf.Graph().as_default():
        w = tf.compat.v1.get_variable("w", initializer=tf.constant(start, tf.float64))
        given = tf.compat.v1.placeholder(tf.float64, start.shape)
        optimizer = towerlib.optimizers.LARSOptimizer(0.5, 0.9, weight_decay=0.01, eta=0.001)
        apply = optimizer.apply_gradients([(given, w)])
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            for gradient in gradients:
                session.run(apply, {given: gradient})
            got = session.run(w)
    want = numpy_lars_steps(start, gradients, 0.5, 0.9, 0.01, 0.001)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("make, text", [
    (lambda: towerlib.optimizers.LARSOptimizer(0.1, weight_decay=float("inf")),
     "weight_decay must be a finite number"),
    (lambda: towerlib.optimizers.LARSOptimizer(-0.1), "learning_rate must be a finite number > 0"),
    (lambda: towerlib.optimizers.LARSOptimizer(float("nan")), "learning_rate must be a finite"),
    (lambda: towerlib.optimizers.LARSOptimizer(0.1, eta=float("inf")), "eta must be a finite"),
    (lambda: towerlib.optimizers.LAMBOptimizer(0.1, epsilon=float("inf")),
     "epsilon must be a finite number"),
    (lambda: towerlib.optimizers.LAMBOptimizer(float("inf")), "learning_rate must be a finite"),
])
def test_values_that_make_every_step_nan_or_zero_are_refused(make, text):
    with pytest.raises(ValueError, match=text) as error:
        make()
    assert "\n" not in str(error.value)


def test_a_schedule_object_as_the_rate_names_its_tensor():
    rate = towerlib.schedules.LearningRate(0.1)
    for make in (towerlib.optimizers.LARSOptimizer, towerlib.optimizers.LAMBOptimizer):
        with pytest.raises(TypeError, match=r"rate\.tensor\(global_step\)"):
            make(rate)

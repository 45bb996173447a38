"""A tf_keras conv + BatchNormalization + Dense model and the same network on towerlib's batch norm.

Both start from the same numbers (`initial_weights`), so a Keras model
through KerasTower can be compared with towerlib's own layers in any
bn_mode, and with one device on the whole batch.
"""

import numpy as np
import tensorflow as tf
import tf_keras

import towerlib

L2 = 0.01
CHANNELS = 6
CLASSES = 5


def initial_weights(seed=7):
    rng = np.random.RandomState(seed)
    return {
        "conv/kernel": (rng.randn(3, 3, 3, CHANNELS) * 0.3).astype(np.float32),
        "conv/bias": (rng.randn(CHANNELS) * 0.1).astype(np.float32),
        "bn/gamma": (1.0 + rng.randn(CHANNELS) * 0.1).astype(np.float32),
        "bn/beta": (rng.randn(CHANNELS) * 0.1).astype(np.float32),
        "bn/moving_mean": np.zeros(CHANNELS, np.float32),
        "bn/moving_variance": np.ones(CHANNELS, np.float32),
        "logits/kernel": (rng.randn(CHANNELS, CLASSES) * 0.3).astype(np.float32),
        "logits/bias": np.zeros(CLASSES, np.float32),
    }


def batch(size, seed=0):
    rng = np.random.RandomState(seed)
    labels = rng.randint(0, CLASSES, size).astype(np.int32)
    images = (rng.randn(size, 8, 8, 3) * 2.0 + 1.5 + labels[:, None, None, None] * 0.3)
    return images.astype(np.float32), labels


def keras_functional(weights=None, momentum=0.9):
    """conv (L2 kernel regularizer) -> BatchNormalization -> ReLU -> mean pool -> Dense."""
    weights = weights or initial_weights()
    const = tf_keras.initializers.Constant
    inputs = tf_keras.Input((8, 8, 3))
    h = tf_keras.layers.Conv2D(
        CHANNELS, 3, name="conv", kernel_regularizer=tf_keras.regularizers.l2(L2),
        kernel_initializer=const(weights["conv/kernel"]),
        bias_initializer=const(weights["conv/bias"]))(inputs)
    h = tf_keras.layers.BatchNormalization(
        name="bn", momentum=momentum, gamma_initializer=const(weights["bn/gamma"]),
        beta_initializer=const(weights["bn/beta"]))(h)
    h = tf_keras.layers.ReLU()(h)
    h = tf_keras.layers.GlobalAveragePooling2D()(h)
    outputs = tf_keras.layers.Dense(CLASSES, name="logits",
                                    kernel_initializer=const(weights["logits/kernel"]))(h)
    return tf_keras.Model(inputs, outputs)


def sparse_cross_entropy(labels, logits):
    return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)


def towerlib_tower(weights=None, momentum=0.9):
    """The same network written with get_variable and towerlib.batch_norm."""
    weights = weights or initial_weights()

    def variable(name, trainable=True, regularizer=None):
        return tf.compat.v1.get_variable(
            name, weights[name].shape, initializer=tf.compat.v1.constant_initializer(
                weights[name]), trainable=trainable, regularizer=regularizer)

    def tower(inputs, ctx):
        images, labels = inputs
        kernel = variable("conv/kernel",
                          regularizer=lambda w: L2 * tf.reduce_sum(tf.square(w)))
        h = tf.nn.conv2d(images, kernel, 1, "VALID") + variable("conv/bias")
        for name in ("bn/gamma", "bn/beta"):
            variable(name)
        for name in ("bn/moving_mean", "bn/moving_variance"):
            variable(name, trainable=False)
        with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope(), reuse=True):
            h = towerlib.batch_norm(h, ctx, name="bn", momentum=momentum, epsilon=1e-3)
        h = tf.reduce_mean(tf.nn.relu(h), axis=[1, 2])
        logits = tf.matmul(h, variable("logits/kernel")) + variable("logits/bias")
        return tf.reduce_mean(sparse_cross_entropy(labels, logits))

    return tower


def optimizer(kind):
    if kind == "adam":
        return tf.compat.v1.train.AdamOptimizer(0.01)
    return tf.compat.v1.train.MomentumOptimizer(0.05, 0.9)


def train(make_tower, images, labels, *, num_towers, bn_mode, update, optimizer_kind,
          steps=5):
    """Global variables' values after `steps` steps, the regularization losses, the copies.

    make_tower() is called in the new graph (a Keras model belongs to one).
    """
    graph = tf.Graph()
    with graph.as_default():
        result = towerlib.build_train_graph(
            make_tower(), (tf.constant(images), tf.constant(labels)),
            optimizer(optimizer_kind), num_towers=num_towers, bn_mode=bn_mode,
            update=update)
        variables = {v.op.name: v for v in tf.compat.v1.global_variables()}
        with tf.compat.v1.Session(config=towerlib.session_config(num_towers)) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(tf.compat.v1.local_variables_initializer())
            losses = []
            for _ in range(steps):
                losses.append(session.run([result.train_op, result.regularization_loss])[1])
            values = session.run(variables)
            copies = {}
            if isinstance(update, towerlib.Replicated):
                copies = {v.op.name: session.run(v) for v in tf.compat.v1.local_variables()
                          if v.op.name.startswith("replicated/")}
    return values, losses, copies

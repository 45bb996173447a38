"""tf_keras itself on one device, the reference a KerasTower build is held to.

`keras_one_device` trains a model the way a Keras user does (eager
`compile` + `train_on_batch` on the whole global batch, legacy SGD with
momentum); `towerlib_steps` trains the same model through KerasTower on
several towers with tf.compat.v1's MomentumOptimizer (the same update:
v = m v + g, w -= lr v). Both return the model's weights in `model.weights`
order, so the two compare entry by entry.
"""

import contextlib

import numpy as np
import tensorflow as tf
import tf_keras

import towerlib

LEARNING_RATE = 0.05
MOMENTUM = 0.9


@contextlib.contextmanager
def keras_policy(name):
    before = tf_keras.mixed_precision.global_policy()
    tf_keras.mixed_precision.set_global_policy(name)
    try:
        yield
    finally:
        tf_keras.mixed_precision.set_global_policy(before)


def keras_one_device(make_model, features, labels, *, loss, steps, loss_weights=None,
                     policy="float32"):
    """[(weight name, value)] after `steps` of tf_keras' own training on the whole batch."""
    tf_keras.backend.clear_session()
    with keras_policy(policy):
        model = make_model()
        model.compile(optimizer=tf_keras.optimizers.legacy.SGD(LEARNING_RATE,
                                                               momentum=MOMENTUM),
                      loss=loss, loss_weights=loss_weights)
    for _ in range(steps):
        model.train_on_batch(features, labels)
    return [(w.name, w.numpy()) for w in model.weights]


def towerlib_steps(tower, features, labels, *, num_towers, bn_mode="sync",
                   update=towerlib.ParameterServer, steps, precision="float32"):
    """(weights in model.weights order, global variables by name, the graph's slot names)."""
    graph = tf.Graph()
    with graph.as_default():
        inputs = (tf.nest.map_structure(tf.constant, features),
                  tf.nest.map_structure(tf.constant, labels))
        train = towerlib.build_train_graph(
            tower, inputs, tf.compat.v1.train.MomentumOptimizer(LEARNING_RATE, MOMENTUM),
            num_towers=num_towers, bn_mode=bn_mode, update=update(), precision=precision)
        weights = tower.model().weights
        variables = {v.op.name: v for v in tf.compat.v1.global_variables()}
        with tf.compat.v1.Session(config=towerlib.session_config(num_towers)) as session:
            train.initialize(session)
            for _ in range(steps):
                session.run(train.train_op)
            return session.run(weights), session.run(variables)


def assert_weights_close(got, want, atol, what=""):
    """`got` (values) against `want` [(name, value)], entry by entry."""
    assert len(got) == len(want), what
    worst = max((float(np.max(np.abs(g - w))), name) for g, (name, w) in zip(got, want))
    assert worst[0] <= atol, f"{what}: {worst[1]} differs from tf_keras by {worst[0]:.3g}"

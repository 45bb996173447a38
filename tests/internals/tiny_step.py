"""A two-tower training step small enough to build several times in one test."""

import contextlib

import numpy as np
import tensorflow as tf

import towerlib

__all__ = ["build_tiny_step"]


def build_tiny_step(*, accumulation_steps=2, update="replicated", bn_mode="sync",
                    batch_norm=True, outer_scope=contextlib.nullcontext):
    """Builds, in the default graph and under `outer_scope()`, the step of a 6 -> 3
    linear model (towerlib.batch_norm on its logits when `batch_norm`) on 8 examples,
    towers on '/device:CPU:0' and '/device:CPU:1'."""
    images = tf.constant(np.linspace(-1, 1, 8 * 6, dtype=np.float32).reshape(8, 6))
    labels = tf.constant([0, 1, 2, 0, 1, 2, 0, 1])

    def tower_fn(inputs, ctx):
        x, y = inputs
        logits = tf.matmul(x, tf.compat.v1.get_variable("w", [6, 3]))
        if batch_norm:
            logits = towerlib.batch_norm(logits, ctx, name="bn")
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=y, logits=logits))

    with outer_scope():
        return towerlib.build_train_graph(
            tower_fn, (images, labels), tf.compat.v1.train.MomentumOptimizer(0.1, 0.9),
            devices=["/device:CPU:0", "/device:CPU:1"], accumulation_steps=accumulation_steps,
            update=update, bn_mode=bn_mode)

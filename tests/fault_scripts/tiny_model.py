"""A tiny two-tower model whose data is a pure function of the global step.

Batch k (the one that produces global step k) is drawn with stateless random
ops seeded by (seed, k - 1), the value of `global_step` when the step starts.
So a run restarted from a checkpoint at step s sees exactly the batches an
uninterrupted run sees after step s, which is what lets the kill/resume test
compare final weights bit for bit.

Shapes: features [global_batch, 6] float32, labels [global_batch] int32 in
[0, 3); one hidden layer of 8 units; Momentum, so checkpoints hold slots.
"""

import numpy as np
import tensorflow as tf

import towerlib
from towerlib import layers

NUM_CLASSES = 3


def session_config(num_towers):
    """Virtual CPU devices, one intra-op thread (the machine is shared)."""
    config = towerlib.session_config(num_towers)
    config.intra_op_parallelism_threads = 1
    config.inter_op_parallelism_threads = 2
    return config


def _poison_gradient(x, poisoned):
    """Identity forward; the backward pass multiplies by Inf when `poisoned`."""

    @tf.custom_gradient
    def identity(value):
        def grad(upstream):
            return upstream * tf.where(poisoned, np.float32(np.inf), np.float32(1.0))
        return tf.identity(value), grad

    return identity(x)


def build(seed=1, num_towers=2, global_batch=8, guarded=True, check_gradients=False,
          nan_loss_at_step=None, inf_gradient_at_step=None, bad_tower=1,
          learning_rate=0.1, hidden_units=8, num_classes=NUM_CLASSES):
    """Builds the training graph in the current default graph.

    Args:
      nan_loss_at_step: the step (1-based, as logged) at which `bad_tower`'s
        loss becomes NaN.
      inf_gradient_at_step: the step at which `bad_tower`'s gradients of the
        hidden layer become Inf while its loss stays finite.
      guarded: wrap the optimizer in towerlib.guard_numerics.
      hidden_units, num_classes: the widths of the two layers (another width
        makes a checkpoint that does not fit).

    Returns:
      the TrainGraph.
    """
    towerlib.seed_everything(seed)
    with tf.device("/device:CPU:0"):
        global_step = tf.compat.v1.train.get_or_create_global_step()
        step_before = tf.cast(global_step, tf.int32)
        features = tf.random.stateless_normal(
            [global_batch, 6], seed=tf.stack([seed, step_before]))
        labels = tf.random.stateless_uniform(
            [global_batch], seed=tf.stack([seed + 1, step_before]),
            minval=0, maxval=num_classes, dtype=tf.int32)

    def at_step(step):
        return tf.equal(step_before, step - 1)

    def tower_fn(inputs, ctx):
        x, y = inputs
        hidden = layers.dense(x, hidden_units, name="hidden")
        if inf_gradient_at_step is not None and ctx.index == bad_tower:
            hidden = _poison_gradient(hidden, at_step(inf_gradient_at_step))
        logits = layers.dense(tf.nn.relu(hidden), num_classes, name="logits")
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=y, logits=logits))
        if nan_loss_at_step is not None and ctx.index == bad_tower:
            loss = loss * tf.where(at_step(nan_loss_at_step), np.float32(np.nan),
                                   np.float32(1.0))
        return loss

    optimizer = tf.compat.v1.train.MomentumOptimizer(learning_rate, 0.9)
    if guarded:
        optimizer = towerlib.guard_numerics(optimizer, check_gradients=check_gradients)
    return towerlib.build_train_graph(
        tower_fn, (features, labels), optimizer, num_towers=num_towers,
        global_step=global_step)


def checkpoint_values(prefix):
    """{variable name: numpy value} of every tensor in a checkpoint."""
    reader = tf.train.load_checkpoint(prefix)
    return {name: reader.get_tensor(name)
            for name in reader.get_variable_to_shape_map()}

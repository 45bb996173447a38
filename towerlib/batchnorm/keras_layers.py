"""tf_keras BatchNormalization layers follow the tower's bn_mode.

A tf_keras model called in a graph-mode tower keeps its batch-norm updates in
`layer.updates`, which no tower loop runs, so its moving statistics would
never move. While a tower builds (`keras_batch_norm_in(ctx)`, entered by
towerlib's tower builder), every tf_keras BatchNormalization call in this
thread is computed by towerlib's batch norm on the layer's own variables
(`gamma`, `beta`, `moving_mean`, `moving_variance`, Keras' names kept, so a
Keras checkpoint still loads):

- training: the statistics bn_mode says (shard, or global under 'sync'),
  and ONE moving-average update per layer and step, emitted by the builder
  under the step's control dependencies (towerlib.batchnorm.normalization);
- inference (`training=False`, an evaluation tower, or a layer with
  `trainable=False`, Keras' frozen batch norm): the moving statistics.

Keras' momentum convention is towerlib's (moving = momentum * moving +
(1 - momentum) * batch). The moving statistics are those tf_keras would
compute on the batch the mode normalizes: a fused layer (4-D or 5-D input,
`layer.fused`) averages the Bessel-corrected variance (x n / (n - 1), n the
examples x positions of the global batch under 'sync' and 'all_towers', of
tower 0's shard under 'first_tower'), a non-fused one the biased variance.

`training` as Keras passes it: a Python bool is used; None or Keras'
learning-phase placeholder means the tower's mode (ctx.is_training); a bool
tensor builds both paths and selects per run, as
towerlib.layers.for_tower(ctx).batch_normalization does.
"""

import contextlib
import dataclasses

import tensorflow as tf

from towerlib.batchnorm import normalization
from towerlib.internals import function_graphs, tf_keras
from towerlib.update import copies as variable_copies


class KerasBatchNormError(ValueError):
    """A tf_keras batch-norm layer uses an option towerlib cannot honour across towers."""


@contextlib.contextmanager
def keras_batch_norm_in(ctx):
    """tf_keras batch norm called in this thread follows `ctx` (a TowerContext) while open.

    tf_keras is never imported here: when the tower itself imports it, its
    batch norm could not be routed, and a layer found in the tower is refused.
    """
    def dispatch(layer, inputs, training):
        return keras_batch_norm(layer, inputs, training, ctx)

    loaded_before = tf_keras.loaded() is not None
    graph = tf.compat.v1.get_default_graph()
    ops_before = len(graph.get_operations())
    with tf_keras.routed_batch_norm_calls(dispatch):
        yield
    if not loaded_before and tf_keras.loaded() is not None:
        _refuse_unrouted_keras_batch_norm(graph.get_operations()[ops_before:], ctx)


def _refuse_unrouted_keras_batch_norm(new_ops, ctx):
    prefix = ctx.name_scope or ""
    found = [op.name for op in new_ops if op.name.startswith(prefix) and (
        op.type.startswith("FusedBatchNorm") or "/AssignMovingAvg" in op.name)]
    if found:
        raise KerasBatchNormError(
            f"tf_keras was first imported while tower {ctx.index} was being built, so "
            f"its batch norm ({found[0]}) ran as Keras' own and its moving statistics "
            "would not follow bn_mode. Fix: import tf_keras before building the graph "
            "(or use towerlib.KerasTower).")


def keras_batch_norm(layer, inputs, training, ctx):
    """A built tf_keras BatchNormalization layer's output for `inputs` in tower `ctx`."""
    axis = _axis_or_refusal(layer, inputs)
    static = _static_training(layer, training, ctx)
    name = layer_key(layer)
    variables = dict(beta=layer.beta if layer.center else None,
                     gamma=layer.gamma if layer.scale else None,
                     moving_mean=layer.moving_mean, moving_variance=layer.moving_variance)

    def normalize(is_training, momentum):
        return normalization.normalize_with_variables(
            tf.convert_to_tensor(inputs), dataclasses.replace(ctx, is_training=is_training),
            layer_name=name, axis=axis, momentum=momentum, epsilon=layer.epsilon,
            unbiased_moving_variance=bool(getattr(layer, "fused", False)), **variables)

    if static is not None:
        return normalize(static, layer.momentum)
    if function_graphs.in_function_body(tf.compat.v1.get_default_graph()):
        raise KerasBatchNormError(
            f"tf_keras BatchNormalization '{layer.name}' got training as a tensor inside "
            "the accumulation loop (accumulation_steps > 1), where its moving-average "
            "switch cannot reach the step's update. Fix: pass training=True (or False), "
            "or accumulation_steps=1.")
    with tf.name_scope("training_switch"):
        switch = tf.convert_to_tensor(training)
        # momentum 1 leaves the moving statistics as they are in an inference run.
        momentum = tf.where(switch, tf.constant(layer.momentum, tf.float32),
                            tf.constant(1.0, tf.float32))
    return tf.where(switch, normalize(True, momentum), normalize(False, layer.momentum))


def layer_key(layer):
    """The layer's variables' scope without tower or copy prefixes ('block1/bn')."""
    name = variable_copies.plain_name(layer.moving_mean.op.name)
    return name.rsplit("/", 1)[0]


def _axis_or_refusal(layer, inputs):
    unsupported = [f"{option}={getattr(layer, attribute)!r}"
                   for option, attribute, off in (
                       ("renorm", "renorm", False),
                       ("virtual_batch_size", "virtual_batch_size", None),
                       ("adjustment", "adjustment", None),
                       ("beta_constraint", "beta_constraint", None),
                       ("gamma_constraint", "gamma_constraint", None))
                   if getattr(layer, attribute, off) is not off]
    axes = list(layer.axis) if isinstance(layer.axis, (list, tuple)) or hasattr(
        layer.axis, "__iter__") else [layer.axis]
    if len(axes) != 1:
        unsupported.append(f"axis={axes}")
    if unsupported:
        raise KerasBatchNormError(
            f"tf_keras BatchNormalization '{layer.name}' uses {', '.join(unsupported)}, "
            "which towerlib's batch norm does not implement across towers. Fix: remove "
            "the option (one channel axis, no renorm, virtual batches, adjustment or "
            "constraints).")
    rank = inputs.shape.rank
    return axes[0] % rank


def _static_training(layer, training, ctx):
    """True / False when known while building, None for a bool tensor chosen per run."""
    if not layer.trainable:
        return False  # Keras: a frozen batch-norm layer runs in inference mode
    if training is None or tf_keras.is_learning_phase(training):
        return bool(ctx.is_training)
    if isinstance(training, (bool, int)) or type(training).__name__ == "bool_":
        return bool(training) and bool(ctx.is_training)
    value = tf.get_static_value(training)
    if value is not None:
        return bool(value) and bool(ctx.is_training)
    if not ctx.is_training:
        return False
    return None

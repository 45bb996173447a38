"""`tf.compat.v1.layers.batch_normalization`, tower-aware: a one-line swap for TF 1 code.

TF 1 code calls `tf.compat.v1.layers.batch_normalization(x, training=...)`,
which knows nothing of towers: under bn_mode 'all_towers' or 'sync' towerlib
refuses it (towerlib.batchnorm.foreign). towerlib's batch norm needs the
tower's context, and towerlib never reads it from a global, so the context
is bound once per tower function instead of passed at every call:

    def tower_fn(inputs, ctx):
        tfl = towerlib.layers.for_tower(ctx)        # was: tfl = tf.compat.v1.layers
        h = tfl.batch_normalization(h, training=True, name="bn1")   # unchanged

`for_tower(ctx).batch_normalization` takes the arguments of
`tf.compat.v1.layers.batch_normalization`, creates the same variables
(`<name>/gamma`, `beta`, `moving_mean`, `moving_variance`, so a checkpoint of
the TF 1 model restores into it), uses the same momentum convention
(moving = momentum * moving + (1 - momentum) * batch), and normalizes and
updates its moving statistics as the tower's bn_mode says. Any other
attribute (`tfl.conv2d`, `tfl.dense`, ...) is `tf.compat.v1.layers`' own.
"""

import dataclasses

import tensorflow as tf

from towerlib.batchnorm import normalization


def for_tower(ctx):
    """The layers for the tower `ctx` (a towerlib.TowerContext); see TowerLayers."""
    return TowerLayers(ctx)


class TowerLayers:
    """`tf.compat.v1.layers` with a batch_normalization bound to one tower's context.

    Make one per tower function call (each tower calls the function with its
    own ctx). Layers without a name are numbered per object, as TF 1 numbers
    them per graph: 'batch_normalization', 'batch_normalization_1', ... in
    call order, the same in every tower.
    """

    def __init__(self, ctx):
        self.ctx = ctx
        self._unnamed_layers = 0

    def __getattr__(self, name):
        # Only reached for names this class does not define (conv2d, dense...).
        layers = getattr(tf.compat.v1, "layers", None)
        if layers is None or not hasattr(layers, name):
            raise AttributeError(
                f"towerlib.layers.for_tower(ctx) provides batch_normalization and "
                f"passes every other name on to tf.compat.v1.layers, which has no "
                f"{name!r} here (tf.compat.v1.layers exists only with the tf_keras "
                "package installed and TF_USE_LEGACY_KERAS=1 set before "
                "TensorFlow is imported). towerlib.layers has conv2d, dense, "
                "embedding, pooling and dropout on get_variable.")
        return getattr(layers, name)

    def batch_normalization(self, inputs, axis=-1, momentum=0.99, epsilon=1e-3,
                            center=True, scale=True, beta_initializer=None,
                            gamma_initializer=None, moving_mean_initializer=None,
                            moving_variance_initializer=None, beta_regularizer=None,
                            gamma_regularizer=None, beta_constraint=None,
                            gamma_constraint=None, training=False, trainable=True,
                            name=None, reuse=None, renorm=False, renorm_clipping=None,
                            renorm_momentum=0.99, fused=None, virtual_batch_size=None,
                            adjustment=None):
        """Batch normalization with tf.compat.v1.layers.batch_normalization's arguments.

        The signature is TensorFlow's, argument for argument, so that ported
        code changes one import and nothing else.

        Args:
          inputs: [N, ..., C] for axis=-1, or e.g. [N, C, H, W] with axis=1.
          axis: the channel axis, an int or a one-element list.
          momentum, epsilon, center, scale: as in TF 1.
          *_initializer, beta_regularizer, gamma_regularizer: as in TF 1 (the
            regularizers count once, registered by tower 0 with the variables).
          training: a Python bool, or a scalar bool tensor. A tensor whose
            value is known when the graph is built counts as that bool. With
            any other tensor both paths are built and selected per run:
            the batch-statistics path (and its cross-tower exchange under
            'sync') runs every step, and the moving statistics stay unchanged
            in steps run with training False, as in TF 1.
          trainable: whether gamma and beta are trainable variables.
          name: the variable scope; None numbers the layer as TF 1 would
            (see TowerLayers). Give names in code with several towers.
          reuse: True to reuse an existing layer's variables.
          fused: accepted and ignored: towerlib's batch norm is its own kernel.

        Unsupported, and refused with an error: renorm=True, virtual_batch_size,
        adjustment, beta_constraint, gamma_constraint.

        Returns:
          A tensor shaped and typed like `inputs`.

        The moving variance is updated from the biased (population) variance
        of the batch, as everywhere in towerlib.
        """
        del renorm_clipping, renorm_momentum, fused  # meaningful only with renorm
        _refuse_unsupported(renorm=renorm, virtual_batch_size=virtual_batch_size,
                            adjustment=adjustment, beta_constraint=beta_constraint,
                            gamma_constraint=gamma_constraint)
        axis = _single_axis(axis)
        if name is None:
            name = "batch_normalization" + (
                f"_{self._unnamed_layers}" if self._unnamed_layers else "")
            self._unnamed_layers += 1
        inputs = tf.convert_to_tensor(inputs)
        channels = _channels(inputs, axis, name)

        with tf.compat.v1.variable_scope(name, reuse=True if reuse else None,
                                         auxiliary_name_scope=False):
            # Created here, with the caller's initializers and regularizers;
            # towerlib's batch norm then finds them (reuse) under the same names.
            if center:
                tf.compat.v1.get_variable(
                    "beta", [channels], trainable=trainable, regularizer=beta_regularizer,
                    initializer=beta_initializer or tf.compat.v1.zeros_initializer())
            if scale:
                tf.compat.v1.get_variable(
                    "gamma", [channels], trainable=trainable, regularizer=gamma_regularizer,
                    initializer=gamma_initializer or tf.compat.v1.ones_initializer())
            tf.compat.v1.get_variable(
                "moving_mean", [channels], trainable=False,
                initializer=moving_mean_initializer or tf.compat.v1.zeros_initializer())
            tf.compat.v1.get_variable(
                "moving_variance", [channels], trainable=False,
                initializer=moving_variance_initializer or tf.compat.v1.ones_initializer())

        def normalize(is_training, layer_momentum):
            ctx = dataclasses.replace(self.ctx, is_training=is_training)
            with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope(), reuse=True,
                                             auxiliary_name_scope=False):
                return normalization.batch_norm(
                    inputs, ctx, name=name, axis=axis, momentum=layer_momentum,
                    epsilon=epsilon, center=center, scale=scale)

        static_training = _static_bool(training)
        if static_training is not None:
            return normalize(static_training, momentum)
        with tf.name_scope(f"{name}_training_switch"):
            training = tf.convert_to_tensor(training)
            # momentum 1 leaves the moving statistics as they are.
            switched_momentum = tf.where(training, tf.constant(momentum, tf.float32),
                                         tf.constant(1.0, tf.float32))
        batch_path = normalize(True, switched_momentum)
        moving_path = normalize(False, momentum)
        return tf.where(training, batch_path, moving_path)


def _refuse_unsupported(**arguments):
    given = [f"{key}={value!r}" for key, value in arguments.items()
             if value is not None and value is not False]
    if given:
        raise ValueError(
            f"towerlib's batch_normalization does not support {', '.join(given)} "
            "(renormalization, virtual batches, adjustment and constraints are not "
            "implemented across towers). Remove the argument, or keep "
            "tf.compat.v1.layers.batch_normalization for this layer and build with "
            "bn_mode='first_tower'.")


def _single_axis(axis):
    if isinstance(axis, (list, tuple)):
        if len(axis) != 1:
            raise ValueError(
                f"batch_normalization: towerlib normalizes per channel along one "
                f"axis; got axis={axis!r}.")
        axis = axis[0]
    if not isinstance(axis, int):
        raise TypeError(f"batch_normalization: axis must be an int, got {axis!r}.")
    return axis


def _channels(inputs, axis, name):
    rank = inputs.shape.rank
    if rank is None or not -rank <= axis < rank or inputs.shape[axis] is None:
        raise ValueError(
            f"batch_normalization '{name}': needs an input of known rank with a known "
            f"channel dimension at axis {axis}, got shape {inputs.shape}.")
    return int(inputs.shape[axis])


def _static_bool(training):
    """training as a Python bool when known at build time, else None (a tensor)."""
    if isinstance(training, (bool, int)) or type(training).__name__ == "bool_":
        return bool(training)
    if not isinstance(training, (tf.Tensor, tf.Variable)):
        raise TypeError(
            f"batch_normalization: training must be a Python bool or a scalar bool "
            f"tensor, got {type(training).__name__}.")
    if training.dtype != tf.bool or training.shape.rank not in (None, 0):
        raise ValueError(
            f"batch_normalization: training must be a scalar bool tensor, got "
            f"{training.dtype.name} of shape {training.shape}.")
    if isinstance(training, tf.Tensor) and training.op.type in ("Placeholder",
                                                                "PlaceholderWithDefault"):
        return None  # fed at run time, whatever its default
    value = tf.get_static_value(training)
    return None if value is None else bool(value)

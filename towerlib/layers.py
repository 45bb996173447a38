"""Layers built on `tf.compat.v1.get_variable`, so that towers share variables.

Keras layers own their variables per layer object and the TF 1 layers module is
gone from TensorFlow 2.21; these functions create variables through the
enclosing variable scope instead, so tower 0 creates and later towers reuse.

Every layer that owns variables takes a required `name`: the variable scope,
and so the checkpoint name, must be the same in every tower, which
auto-numbered default names cannot promise.

Weight decay (`weight_decay > 0`) registers `weight_decay * sum(w ** 2) / 2`
in REGULARIZATION_LOSSES when the variable is created, i.e. once, in tower 0,
however many towers there are.
"""

import tensorflow as tf

from towerlib.batchnorm.normalization import batch_norm  # noqa: F401  (re-exported)
from towerlib.batchnorm.tower_layers import TowerLayers, for_tower  # noqa: F401  (re-exported)


def _l2_regularizer(weight_decay):
    if weight_decay < 0:
        raise ValueError(f"weight_decay must be >= 0, got {weight_decay}.")
    if not weight_decay:
        return None
    return lambda weights: tf.multiply(
        weight_decay, tf.nn.l2_loss(weights), name="weight_decay")


def _he_normal():
    return tf.compat.v1.variance_scaling_initializer(
        scale=2.0, mode="fan_in", distribution="truncated_normal")


def _pair(value, what, layer_name):
    """An int or (height, width) pair of positive ints, as (height, width)."""
    pair = (value, value) if isinstance(value, int) else tuple(value)
    if len(pair) != 2 or not all(isinstance(v, int) and v > 0 for v in pair):
        raise ValueError(
            f"conv2d '{layer_name}': {what} must be a positive int or a (height, "
            f"width) pair of them, got {value!r}.")
    return pair


def _channels(x, data_format):
    axis = 1 if data_format == "NCHW" else -1
    channels = x.shape[axis]
    if channels is None:
        raise ValueError(
            f"The channel dimension of {x.name} (shape {x.shape}, data_format "
            f"{data_format}) must be known when the graph is built.")
    return int(channels)


_LAYER_DTYPES = (tf.float16, tf.bfloat16, tf.float32)


def _check_name(layer, name):
    """A layer's name is its variable scope: a non-empty string, the same in every tower."""
    if isinstance(name, tf.compat.v1.VariableScope):
        return
    if not isinstance(name, str) or not name:
        raise TypeError(
            f"{layer}: name must be a non-empty string, got {name!r}; it is the variable "
            "scope of the layer's weights, which every tower must spell alike (no "
            f"automatic names). Fix: e.g. {layer}(..., name='{layer}_1').")


def _check_float_input(x, layer, name):
    """Refuses integer or float64 inputs with the fix, before TensorFlow does, deep down."""
    x = tf.convert_to_tensor(x)
    if x.dtype.base_dtype not in _LAYER_DTYPES:
        raise TypeError(
            f"{layer} '{name}' got {x.name} of dtype {x.dtype.name}; towerlib's "
            "layers compute in float32, float16 or bfloat16 (their weights take the "
            "input's dtype). Cast the input first, e.g. images = "
            "tf.cast(images, tf.float32) / 255.0 for uint8 pixels.")
    return x


def conv2d(x, filters, kernel_size, *, name, strides=1, padding="SAME",
           use_bias=True, activation=None, weight_decay=0.0,
           kernel_initializer=None, data_format="NHWC"):
    """2-D convolution.

    Args:
      x: [N, H, W, C] (NHWC) or [N, C, H, W] (NCHW, faster on GPUs).
      filters: output channels.
      kernel_size, strides: ints or (height, width) pairs.
      name: variable scope of the kernel 'weights' and 'biases'.

    Returns:
      [N, H', W', filters] (or NCHW).
    """
    if data_format not in ("NHWC", "NCHW"):
        raise ValueError(f"data_format must be 'NHWC' or 'NCHW', got {data_format!r}.")
    _check_name("conv2d", name)
    x = _check_float_input(x, "conv2d", name)
    kh, kw = _pair(kernel_size, "kernel_size", name)
    sh, sw = _pair(strides, "strides", name)
    in_channels = _channels(x, data_format)
    stride_list = [1, sh, sw, 1] if data_format == "NHWC" else [1, 1, sh, sw]
    with tf.compat.v1.variable_scope(name):
        kernel = tf.compat.v1.get_variable(
            "weights", [kh, kw, in_channels, filters], dtype=x.dtype,
            initializer=kernel_initializer or _he_normal(),
            regularizer=_l2_regularizer(weight_decay))
        y = tf.nn.conv2d(x, kernel, strides=stride_list, padding=padding,
                         data_format=data_format)
        if use_bias:
            bias = tf.compat.v1.get_variable(
                "biases", [filters], dtype=x.dtype,
                initializer=tf.compat.v1.zeros_initializer())
            y = tf.nn.bias_add(y, bias, data_format=data_format)
        return activation(y) if activation else y


def dense(x, units, *, name, use_bias=True, activation=None, weight_decay=0.0,
          kernel_initializer=None):
    """Fully connected layer: [N, D] -> [N, units]."""
    _check_name("dense", name)
    x = _check_float_input(x, "dense", name)
    if x.shape.rank != 2 or x.shape[-1] is None:
        raise ValueError(
            f"dense expects a [batch, features] input with known features, got "
            f"{x.name} with shape {x.shape}. Flatten it first (towerlib.layers.flatten).")
    with tf.compat.v1.variable_scope(name):
        kernel = tf.compat.v1.get_variable(
            "weights", [int(x.shape[-1]), units], dtype=x.dtype,
            initializer=kernel_initializer or tf.compat.v1.glorot_uniform_initializer(),
            regularizer=_l2_regularizer(weight_decay))
        y = tf.matmul(x, kernel)
        if use_bias:
            bias = tf.compat.v1.get_variable(
                "biases", [units], dtype=x.dtype,
                initializer=tf.compat.v1.zeros_initializer())
            y = tf.nn.bias_add(y, bias)
        return activation(y) if activation else y


def embedding(ids, vocab_size, dim, *, name, weight_decay=0.0, initializer=None):
    """Looks up rows of a [vocab_size, dim] table: ids [...] -> [..., dim].

    The gradient of the table is IndexedSlices, and stays sparse through
    towerlib's aggregation.
    """
    _check_name("embedding", name)
    ids = tf.convert_to_tensor(ids)
    if not ids.dtype.is_integer:
        raise TypeError(f"embedding '{name}' needs integer ids, got {ids.name} of dtype "
                        f"{ids.dtype.name}; cast them with tf.cast(ids, tf.int32).")
    with tf.compat.v1.variable_scope(name):
        table = tf.compat.v1.get_variable(
            "embeddings", [vocab_size, dim],
            initializer=initializer or tf.compat.v1.random_normal_initializer(stddev=0.05),
            regularizer=_l2_regularizer(weight_decay))
        return tf.nn.embedding_lookup(table, ids)


def max_pool2d(x, pool_size, strides=None, padding="SAME", data_format="NHWC"):
    """Max pooling; strides default to the pool size (non-overlapping windows)."""
    strides = pool_size if strides is None else strides
    return tf.nn.max_pool2d(x, pool_size, strides, padding, data_format=data_format)


def avg_pool2d(x, pool_size, strides=None, padding="SAME", data_format="NHWC"):
    """Average pooling; strides default to the pool size (non-overlapping windows)."""
    strides = pool_size if strides is None else strides
    return tf.nn.avg_pool2d(x, pool_size, strides, padding, data_format=data_format)


def global_avg_pool2d(x, data_format="NHWC"):
    """[N, H, W, C] -> [N, C] (or from NCHW)."""
    axes = [1, 2] if data_format == "NHWC" else [2, 3]
    return tf.reduce_mean(x, axis=axes)


def flatten(x):
    """[N, ...] -> [N, prod(...)], with the feature size known statically."""
    features = x.shape[1:].num_elements()
    if features is None:
        raise ValueError(f"flatten needs known non-batch dimensions, got {x.shape}.")
    return tf.reshape(x, [-1, features])


def dropout(x, rate, ctx, seed=None):
    """Drops units with probability `rate` in training; identity in inference.

    rate: a float in [0, 1) or a float scalar tensor. With a `seed`, each
    tower still draws its own mask (the seed is combined with the tower
    index): one device on the whole batch would not repeat a mask either.
    """
    if isinstance(rate, (int, float)):
        if not 0 <= rate < 1:
            raise ValueError(f"dropout rate must be in [0, 1), got {rate}.")
        if rate == 0:
            return x
    if not ctx.is_training:
        return x
    if seed is not None:
        seed = seed * 1_000_003 + ctx.index
    return tf.nn.dropout(x, rate=rate, seed=seed)

"""What one tower reports of one batch-norm layer in a step (the builder emits the updates)."""

import dataclasses
from typing import Any

import tensorflow as tf


@dataclasses.dataclass
class BatchNormStatistics:
    """One tower's batch statistics for one batch-norm layer in one step.

    `count` is a float32 scalar (examples x spatial positions reduced over);
    `mean` and `variance` have the layer's channel shape, `variance` is the
    biased (population) variance. `moving_mean` and `moving_variance` are the
    layer's shared variables. `unbiased` says the moving variance takes the
    Bessel-corrected variance of the batch normalized (x n / (n - 1)), as
    tf_keras' fused kernel does; towerlib's own batch norm takes the biased one.
    """

    tower_index: int
    count: tf.Tensor
    mean: tf.Tensor
    variance: tf.Tensor
    moving_mean: Any
    moving_variance: Any
    momentum: float
    unbiased: bool = False


def moving_variance_input(variance, count, unbiased):
    """The value a moving variance averages in: `variance`, or x n / (n - 1) if `unbiased`.

    n is the count of the batch normalized (examples x positions); a batch of
    one value keeps its variance (0) rather than dividing by zero.
    """
    if not unbiased:
        return variance
    count = tf.cast(count, variance.dtype)
    return variance * (count / tf.maximum(count - 1.0, 1.0))

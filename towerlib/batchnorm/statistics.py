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
    layer's shared variables.
    """

    tower_index: int
    count: tf.Tensor
    mean: tf.Tensor
    variance: tf.Tensor
    moving_mean: Any
    moving_variance: Any
    momentum: float

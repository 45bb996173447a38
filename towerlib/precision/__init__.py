"""Compute dtypes for the towers, float32 weights, and float16's loss scaling.

    train = towerlib.build_train_graph(model, batch, optimizer,
                                       precision=towerlib.Float16(loss_scale="dynamic"))

The package, one job per module:

  choice.py        Float32, BFloat16, Float16: the `precision=` option objects
  casting.py       inputs cast to the compute dtype, weights stored in float32
  loss_scaling.py  float16's loss scale: scale, unscale, skip an overflowing step
"""

from towerlib.precision.choice import (
                                       PRECISION_NAMES,
                                       BFloat16,
                                       Float16,
                                       Float32,
                                       Precision,
                                       resolve_precision,
)

__all__ = ["BFloat16", "Float16", "Float32", "PRECISION_NAMES", "Precision",
           "resolve_precision"]

"""The `precision=` option: what the towers compute in, and float16's loss scale.

    precision = towerlib.Float32()                    # the default
    precision = towerlib.BFloat16()                   # float32's range: no scaling
    precision = towerlib.Float16(loss_scale="dynamic")  # or a number: a fixed scale
    train = towerlib.build_train_graph(model, batch, optimizer, precision=precision)

In each the weights, the loss, the batch-norm statistics and the gradients
stay float32 (towerlib.precision.casting); only the towers' activations take
the compute dtype. The names 'float32', 'bfloat16' and 'float16' (or their
tf.DType) are shorthands for the defaults.
"""

import dataclasses
import math
import numbers
from typing import Union

import tensorflow as tf

from towerlib.precision import casting, guards, loss_scaling

__all__ = ["BFloat16", "Float16", "Float32", "Precision", "PRECISION_NAMES",
           "resolve_precision"]

PRECISION_NAMES = ("float32", "bfloat16", "float16")


class Precision:
    """A compute dtype for the towers; see the subclasses."""

    name = ""

    @property
    def compute_dtype(self) -> tf.DType:
        return tf.as_dtype(self.name)

    def check_optimizer(self, optimizer) -> None:
        """Refuses an optimizer this precision cannot train with."""
        del optimizer

    def make_loss_scale(self):
        """The LossScale for one build, in the current graph and device; or None."""
        return None


@dataclasses.dataclass(frozen=True)
class Float32(Precision):
    """Full precision: the towers compute in float32."""

    name = "float32"


@dataclasses.dataclass(frozen=True)
class BFloat16(Precision):
    """bfloat16 activations: float32's exponent range, so no loss scaling."""

    name = "bfloat16"


@dataclasses.dataclass(frozen=True)
class Float16(Precision):
    """float16 activations with loss scaling, so small gradients do not underflow.

    Attributes:
      loss_scale: 'dynamic' (halves on an overflow, grows after good steps),
        a finite number > 0 (a fixed scale; powers of 2 are exact), or a
        towerlib.loss_scaling.LossScale built in the training graph.
    """

    loss_scale: Union[str, float, loss_scaling.LossScale] = "dynamic"
    name = "float16"

    def __post_init__(self):
        scale = self.loss_scale
        if (isinstance(scale, str) and scale == "dynamic") \
                or isinstance(scale, loss_scaling.LossScale):
            return
        if isinstance(scale, bool) or not isinstance(scale, numbers.Real) \
                or not math.isfinite(scale) or scale < 1:
            raise ValueError(
                f"Float16(loss_scale={scale!r}): the loss scale must be 'dynamic', a "
                "finite number >= 1 (e.g. 1024, a fixed scale; below 1 it pushes small "
                "gradients under float16's range, and the weights stop moving) or a "
                "towerlib.loss_scaling.LossScale. Fix: loss_scale='dynamic'.")
        object.__setattr__(self, "loss_scale", float(scale))  # numpy numbers too

    def check_optimizer(self, optimizer):
        for guard in guards.guards_in(optimizer):
            if guard.check_gradients:
                raise ValueError(
                    "guard_numerics(check_gradients=True) with towerlib.Float16(): under "
                    "loss scaling an overflowing gradient is expected (the step is "
                    "skipped and the scale lowered), not an error. Use "
                    "guard_numerics(optimizer), which still stops on a non-finite loss.")
        if isinstance(optimizer, tf.compat.v1.train.SyncReplicasOptimizer):
            raise ValueError(
                "towerlib.Float16() with SyncReplicasOptimizer: a replica that skips an "
                "overflowing step sends no gradients and the others would wait for it. "
                "Fix: towerlib.BFloat16() (no loss scaling) across machines.")

    def make_loss_scale(self):
        return loss_scaling.make_loss_scale(self.loss_scale)


def resolve_precision(precision) -> Precision:
    """The Precision for `precision`: a Precision, or a name in PRECISION_NAMES or its DType."""
    if isinstance(precision, Precision):
        return precision
    dtype = casting.check_compute_dtype(precision)  # the one rule for the names
    return {"float32": Float32, "bfloat16": BFloat16, "float16": Float16}[dtype.name]()

"""Learning-rate schedules counted in optimizer steps, one step per GLOBAL batch.

    rate = towerlib.schedules.LearningRate(
        base_rate=towerlib.schedules.linear_scaling(0.1, global_batch=1024),  # 0.4
        warmup=towerlib.schedules.Warmup(steps=steps_for_epochs(5, 50000, 1024)),
        decay=towerlib.schedules.CosineDecay(total_steps=steps_for_epochs(90, 50000, 1024)))
    optimizer = tf.compat.v1.train.MomentumOptimizer(rate.tensor(global_step), 0.9)

A step is one update on the whole global batch (every tower, micro-batch and
worker), so a schedule stated in epochs means the same on 1 tower or 64:
convert with `steps_for_epochs`. The linear scaling rule (Goyal et al. 2017)
scales the rate with the global batch; a warm-up ramps it up first.

`rate_at(step)` is the rate of the update that takes global_step from `step`
to step + 1, in Python; `tensor(global_step)` the same as a float32 tensor.
"""

import dataclasses
import math
import numbers
from typing import Optional, Tuple

import tensorflow as tf

__all__ = ["CosineDecay", "LearningRate", "PiecewiseConstant", "PolynomialDecay", "Warmup",
           "linear_scaling", "steps_for_epochs"]


def linear_scaling(base_rate, global_batch, reference_batch=256):
    """base_rate * global_batch / reference_batch: the rate for `global_batch` examples
    a step when `base_rate` suits `reference_batch` (Goyal et al. 2017)."""
    _check(base_rate > 0 and global_batch >= 1 and reference_batch >= 1,
           f"linear_scaling({base_rate!r}, {global_batch!r}, {reference_batch!r}): the "
           "rate must be > 0 and the batches >= 1.")
    return float(base_rate) * global_batch / reference_batch


def steps_for_epochs(epochs, examples_per_epoch, global_batch):
    """The optimizer step at which `epochs` passes over the data end (rounded)."""
    _check(epochs >= 0 and examples_per_epoch >= 1 and global_batch >= 1,
           f"steps_for_epochs({epochs!r}, {examples_per_epoch!r}, {global_batch!r}): "
           "epochs must be >= 0, the examples and the global batch >= 1.")
    return int(round(epochs * examples_per_epoch / global_batch))


@dataclasses.dataclass(frozen=True)
class Warmup:
    """A linear ramp over the first `steps` steps, from start_fraction to 1 of the rate.

    Step s < steps runs at base * (start + (1 - start) * (s + 1) / steps): with
    start_fraction 0 the first update uses base / steps, never 0.
    """

    steps: int
    start_fraction: float = 0.0

    def __post_init__(self):
        _check(_is_int(self.steps) and self.steps >= 0 and 0 <= self.start_fraction <= 1,
               f"Warmup(steps={self.steps!r}, start_fraction={self.start_fraction!r}): "
               "steps must be an int >= 0 and start_fraction in [0, 1].")


@dataclasses.dataclass(frozen=True)
class PiecewiseConstant:
    """The rate times `factor` at each boundary step passed (boundaries ascending)."""

    boundaries: Tuple[int, ...]
    factor: float = 0.1

    def __post_init__(self):
        bounds = tuple(int(b) for b in self.boundaries)
        _check(list(bounds) == sorted(bounds) and all(b >= 0 for b in bounds)
               and 0 < self.factor <= 1,
               f"PiecewiseConstant({list(self.boundaries)!r}, factor={self.factor!r}): "
               "boundaries must be ascending steps >= 0 and the factor in (0, 1].")
        object.__setattr__(self, "boundaries", bounds)

    def fraction(self, step, start):
        del start  # boundaries count from step 0
        return self.factor ** sum(1 for b in self.boundaries if step >= b)

    def fraction_tensor(self, step, start):
        del start
        if not self.boundaries:
            return tf.constant(1.0)
        passed = tf.reduce_sum(tf.cast(
            step >= tf.constant(self.boundaries, tf.int64), tf.int32))
        values = tf.constant([self.factor ** i for i in range(len(self.boundaries) + 1)],
                             tf.float32)
        return tf.gather(values, passed)


@dataclasses.dataclass(frozen=True)
class CosineDecay:
    """Half a cosine from 1 to end_fraction between the warm-up's end and total_steps."""

    total_steps: int
    end_fraction: float = 0.0

    def __post_init__(self):
        _check(_is_int(self.total_steps) and self.total_steps >= 1
               and 0 <= self.end_fraction <= 1,
               f"CosineDecay(total_steps={self.total_steps!r}, end_fraction="
               f"{self.end_fraction!r}): total_steps an int >= 1, end_fraction in [0, 1].")

    def fraction(self, step, start):
        progress = _progress(step, start, self.total_steps)
        return self.end_fraction + (1 - self.end_fraction) * 0.5 * (
            1 + math.cos(math.pi * progress))

    def fraction_tensor(self, step, start):
        progress = _progress_tensor(step, start, self.total_steps)
        return self.end_fraction + (1 - self.end_fraction) * 0.5 * (
            1 + tf.cos(math.pi * progress))


@dataclasses.dataclass(frozen=True)
class PolynomialDecay:
    """(1 - progress) ** power from 1 to end_fraction between the warm-up's end and
    total_steps (power 1: linear)."""

    total_steps: int
    end_fraction: float = 0.0
    power: float = 1.0

    def __post_init__(self):
        _check(_is_int(self.total_steps) and self.total_steps >= 1
               and 0 <= self.end_fraction <= 1 and self.power > 0,
               f"PolynomialDecay(total_steps={self.total_steps!r}, ...): total_steps an "
               "int >= 1, end_fraction in [0, 1], power > 0.")

    def fraction(self, step, start):
        progress = _progress(step, start, self.total_steps)
        return self.end_fraction + (1 - self.end_fraction) * (1 - progress) ** self.power

    def fraction_tensor(self, step, start):
        progress = _progress_tensor(step, start, self.total_steps)
        return self.end_fraction + (1 - self.end_fraction) * (1 - progress) ** self.power


@dataclasses.dataclass(frozen=True)
class LearningRate:
    """base_rate, ramped by `warmup`, then times `decay`'s fraction (None: constant)."""

    base_rate: float
    decay: Optional[object] = None
    warmup: Optional[Warmup] = None

    def __post_init__(self):
        _check(isinstance(self.base_rate, numbers.Real) and 0 < self.base_rate < math.inf,
               f"LearningRate(base_rate={self.base_rate!r}): a finite rate > 0.")
        _check(self.decay is None or hasattr(self.decay, "fraction_tensor"),
               f"LearningRate(decay={self.decay!r}): None, PiecewiseConstant, CosineDecay "
               "or PolynomialDecay.")
        _check(self.warmup is None or isinstance(self.warmup, Warmup),
               f"LearningRate(warmup={self.warmup!r}): None or Warmup(steps).")

    @property
    def _warmup_steps(self):
        return self.warmup.steps if self.warmup is not None else 0

    def rate_at(self, step: int) -> float:
        """The rate of the update from global step `step` to step + 1."""
        warm = self._warmup_steps
        if step < warm:
            start = self.warmup.start_fraction
            return self.base_rate * (start + (1 - start) * (step + 1) / warm)
        fraction = 1.0 if self.decay is None else self.decay.fraction(step, warm)
        return self.base_rate * fraction

    def tensor(self, global_step):
        """The rate as a float32 scalar tensor of `global_step` (an int variable)."""
        with tf.name_scope("learning_rate_schedule"):
            step = tf.cast(global_step, tf.int64)
            fraction = (tf.constant(1.0) if self.decay is None
                        else self.decay.fraction_tensor(step, self._warmup_steps))
            rate = self.base_rate * tf.cast(fraction, tf.float32)
            warm = self._warmup_steps
            if warm:
                start = self.warmup.start_fraction
                ramp = self.base_rate * (start + (1 - start) * tf.cast(step + 1, tf.float32)
                                         / float(warm))
                rate = tf.where(step < warm, ramp, rate)
            return tf.identity(rate, name="rate")


def _progress(step, start, total):
    return min(1.0, max(0.0, (step - start) / max(1, total - start)))


def _progress_tensor(step, start, total):
    fraction = tf.cast(step - start, tf.float32) / float(max(1, total - start))
    return tf.clip_by_value(fraction, 0.0, 1.0)


def _is_int(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check(condition, message):
    if not condition:
        raise ValueError(message)

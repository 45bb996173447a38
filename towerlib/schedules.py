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
PiecewiseConstant's boundaries mean what tf.compat.v1.train.piecewise_constant's
do (a boundary's step still runs at the old rate), so ported TF 1 code keeps its
schedule. A decay that would act inside the warm-up is refused.
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
    _check(_is_rate(base_rate) and _is_count(global_batch) and _is_count(reference_batch),
           f"linear_scaling({base_rate!r}, {global_batch!r}, {reference_batch!r}): the "
           "rate must be a finite number > 0 and the batches whole numbers >= 1.")
    return float(base_rate) * global_batch / reference_batch


def steps_for_epochs(epochs, examples_per_epoch, global_batch):
    """The optimizer step at which `epochs` passes over the data end (rounded)."""
    _check(_is_real(epochs) and 0 <= epochs < math.inf and _is_count(examples_per_epoch)
           and _is_count(global_batch),
           f"steps_for_epochs({epochs!r}, {examples_per_epoch!r}, {global_batch!r}): "
           "epochs must be a finite number >= 0, the examples and the global batch whole "
           "numbers >= 1.")
    return int(round(epochs * examples_per_epoch / global_batch))


@dataclasses.dataclass(frozen=True)
class Warmup:
    """A linear ramp over the first `steps` steps, from start_fraction to 1 of the rate.

    ramp="after_first_step" (the default): step s < steps runs at
    base * (start + (1 - start) * (s + 1) / steps), so with start_fraction 0 the
    first update uses base / steps, never 0.
    ramp="from_start": step s < steps runs at base * (start + (1 - start) * s / steps),
    so step 0 runs at exactly start_fraction * base. Goyal et al. (2017) ramp this
    way from the small batch's rate: `Warmup.from_small_batch` builds that form.
    """

    steps: int
    start_fraction: float = 0.0
    ramp: str = "after_first_step"

    def __post_init__(self):
        _check(_is_int(self.steps) and self.steps >= 0 and _is_real(self.start_fraction)
               and 0 <= self.start_fraction <= 1,
               f"Warmup(steps={self.steps!r}, start_fraction={self.start_fraction!r}): "
               "steps must be an int >= 0 and start_fraction in [0, 1].")
        _check(self.ramp in ("after_first_step", "from_start"),
               f"Warmup(ramp={self.ramp!r}): 'after_first_step' or 'from_start'.")
        _check(self.ramp != "from_start" or self.start_fraction > 0,
               "Warmup(ramp='from_start', start_fraction=0) runs its first step at rate 0. "
               "Fix: a start_fraction > 0, e.g. Warmup.from_small_batch(steps, global_batch).")

    @classmethod
    def from_small_batch(cls, steps, global_batch, reference_batch=256):
        """Goyal et al.'s gradual warm-up: from the rate of `reference_batch` (the
        base rate before linear_scaling) at step 0 up to the full rate at `steps`."""
        _check(_is_count(global_batch) and _is_count(reference_batch)
               and global_batch >= reference_batch,
               f"Warmup.from_small_batch({steps!r}, {global_batch!r}, {reference_batch!r}): "
               "the batches must be whole numbers with global_batch >= reference_batch.")
        return cls(steps, start_fraction=reference_batch / global_batch, ramp="from_start")

    def fraction(self, step):
        """The fraction of the base rate at a step s < steps (Python or int64 tensor)."""
        offset = 1 if self.ramp == "after_first_step" else 0
        start = self.start_fraction
        if tf.is_tensor(step):  # a tensor or a variable
            return start + (1 - start) * tf.cast(step + offset, tf.float32) / float(self.steps)
        return start + (1 - start) * (step + offset) / self.steps


def _is_whole(value):
    """An int, or a float with no fraction (30000.0 from a config file): a step number."""
    return _is_int(value) or (_is_real(value) and float(value).is_integer())


@dataclasses.dataclass(frozen=True)
class PiecewiseConstant:
    """The rate times `factor` once per boundary passed, as TensorFlow 1 counts them.

    Step s runs at factor ** (the number of boundaries b with s > b), as
    tf.compat.v1.train.piecewise_constant(global_step, boundaries, values) gives:
    the boundary's own step still runs at the old rate. The boundaries are whole
    step numbers >= 0, strictly ascending, counted from step 0.
    """

    boundaries: Tuple[int, ...]
    factor: float = 0.1

    def __post_init__(self):
        given = self.boundaries
        listed = hasattr(given, "__iter__") and not isinstance(given, (str, bytes, dict))
        bounds = tuple(given) if listed else None
        _check(bounds is not None and all(_is_whole(b) and 0 <= b < 2**63 - 1 for b in bounds)
               and all(a < b for a, b in zip(bounds, bounds[1:]))
               and _is_real(self.factor) and 0 < self.factor <= 1,
               f"PiecewiseConstant({given!r}, factor={self.factor!r}): boundaries must be "
               "a list of whole steps >= 0 (below 2**63 - 1: global_step is an int64), "
               "strictly ascending (a repeated step would decay "
               "twice), and the factor in (0, 1]. Fix: e.g. PiecewiseConstant([100, 150]).")
        object.__setattr__(self, "boundaries", tuple(int(b) for b in bounds))

    def check_after(self, warmup_steps):
        """Refuses a boundary whose decay would start inside the warm-up's ramp."""
        early = [b for b in self.boundaries if b + 1 < warmup_steps]
        _check(not early, f"PiecewiseConstant({list(self.boundaries)!r}): the decays after "
               f"steps {early} start inside Warmup(steps={warmup_steps}), which ramps to "
               "the undecayed rate. Fix: boundaries >= the warm-up's steps - 1.")

    def fraction(self, step, start):
        del start  # boundaries count from step 0
        return self.factor ** sum(1 for b in self.boundaries if step > b)

    def fraction_tensor(self, step, start):
        del start
        if not self.boundaries:
            return tf.constant(1.0)
        passed = tf.reduce_sum(tf.cast(
            step > tf.constant(self.boundaries, tf.int64), tf.int32))
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
               and _is_real(self.end_fraction) and 0 <= self.end_fraction <= 1,
               f"CosineDecay(total_steps={self.total_steps!r}, end_fraction="
               f"{self.end_fraction!r}): total_steps an int >= 1, end_fraction in [0, 1].")

    def check_after(self, warmup_steps):
        """Refuses a decay that ends before the warm-up does."""
        _check_ends_after(self, warmup_steps)

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
               and _is_real(self.end_fraction) and 0 <= self.end_fraction <= 1
               and _is_real(self.power) and 0 < self.power < math.inf,
               f"PolynomialDecay(total_steps={self.total_steps!r}, end_fraction="
               f"{self.end_fraction!r}, power={self.power!r}): total_steps an "
               "int >= 1, end_fraction in [0, 1], power a finite number > 0.")

    def check_after(self, warmup_steps):
        """Refuses a decay that ends before the warm-up does."""
        _check_ends_after(self, warmup_steps)

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
        _check(_is_rate(self.base_rate),
               f"LearningRate(base_rate={self.base_rate!r}): a finite rate > 0.")
        _check(self.decay is None or hasattr(self.decay, "fraction_tensor"),
               f"LearningRate(decay={self.decay!r}): None, PiecewiseConstant, CosineDecay "
               "or PolynomialDecay.")
        _check(self.warmup is None or isinstance(self.warmup, Warmup),
               f"LearningRate(warmup={self.warmup!r}): None or Warmup(steps).")
        if self.decay is not None and hasattr(self.decay, "check_after"):
            self.decay.check_after(self._warmup_steps)

    def __tf_tensor__(self, dtype=None, name=None):
        raise TypeError("A towerlib.schedules.LearningRate is a schedule, not a tensor. "
                        "Fix: pass rate.tensor(global_step) as the optimizer's rate.")

    @property
    def _warmup_steps(self):
        return self.warmup.steps if self.warmup is not None else 0

    def rate_at(self, step: int) -> float:
        """The rate of the update from global step `step` to step + 1."""
        warm = self._warmup_steps
        if step < warm:
            return self.base_rate * self.warmup.fraction(step)
        fraction = 1.0 if self.decay is None else self.decay.fraction(step, warm)
        return self.base_rate * fraction

    def tensor(self, global_step):
        """The rate as a float32 scalar tensor of `global_step` (an int variable)."""
        with tf.name_scope("learning_rate_schedule"):
            # A variable's own dtype returns the variable itself from tf.cast: read it.
            step = tf.cast(tf.convert_to_tensor(global_step), tf.int64)
            fraction = (tf.constant(1.0) if self.decay is None
                        else self.decay.fraction_tensor(step, self._warmup_steps))
            rate = self.base_rate * tf.cast(fraction, tf.float32)
            warm = self._warmup_steps
            if warm:
                ramp = self.base_rate * self.warmup.fraction(step)
                rate = tf.where(step < warm, ramp, rate)
            return tf.identity(rate, name="rate")


def _progress(step, start, total):
    return min(1.0, max(0.0, (step - start) / max(1, total - start)))


def _progress_tensor(step, start, total):
    fraction = tf.cast(step - start, tf.float32) / float(max(1, total - start))
    return tf.clip_by_value(fraction, 0.0, 1.0)


def _check_ends_after(decay, warmup_steps):
    name = type(decay).__name__
    _check(not warmup_steps or decay.total_steps > warmup_steps,
           f"{name}(total_steps={decay.total_steps}) ends before Warmup(steps="
           f"{warmup_steps}) does: the rate would drop to end_fraction when the warm-up "
           "ends. Fix: total_steps counts from step 0, warm-up included; make it larger.")


def _is_int(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value):
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _is_count(value):
    return _is_int(value) and value >= 1


def _is_rate(value):
    return _is_real(value) and 0 < value < math.inf


def _check(condition, message):
    if not condition:
        raise ValueError(message)

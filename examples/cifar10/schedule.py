"""A learning-rate schedule stated in epochs and derived from the GLOBAL batch.

One optimizer step consumes one global batch (all towers together), so

    steps per epoch = examples per epoch / global batch size

and a schedule written in epochs ("divide by 10 at epochs 100 and 150") means the same
thing whether the global batch is spread over 1 tower or 8. The classic multi-GPU tutorial
counted decay steps in per-tower batches, so adding GPUs silently changed its schedule.

Optionally the base rate scales linearly with the global batch (Goyal et al., 2017): the
rate is given for a reference batch of 128 and multiplied by global_batch / 128, with an
optional linear warm-up over the first epochs.
"""

import dataclasses
from typing import List, Optional, Sequence, Tuple

import towerlib
import towerlib.schedules  # noqa: F401  (towerlib.schedules.LearningRate...)

REFERENCE_BATCH_SIZE = 128


@dataclasses.dataclass(frozen=True)
class LearningRateSchedule:
    """Piecewise-constant rate with an optional linear warm-up, in optimizer steps.

    Attributes:
      base_rate: the rate after warm-up and before the first decay (already scaled).
      warmup_steps: steps over which the rate rises linearly from base_rate / warmup_steps
        to base_rate (0: no warm-up).
      boundaries: the steps after which the rate is multiplied by decay_factor, ascending
        (tf.compat.v1.train.piecewise_constant's boundaries: step b runs at the old rate).
      decay_factor: the multiplier at each boundary.
    """

    base_rate: float
    warmup_steps: int
    boundaries: List[int]
    decay_factor: float

    def library_schedule(self) -> towerlib.schedules.LearningRate:
        """The same schedule as towerlib.schedules objects (what computes it)."""
        return towerlib.schedules.LearningRate(
            self.base_rate,
            decay=towerlib.schedules.PiecewiseConstant(self.boundaries, self.decay_factor),
            warmup=towerlib.schedules.Warmup(self.warmup_steps) if self.warmup_steps else None)

    def rate_at(self, step: int) -> float:
        """The rate used by the update that brings global_step from ``step`` to step + 1."""
        return self.library_schedule().rate_at(step)

    def tensor(self, global_step):
        """The rate as a float32 scalar tensor of the int64 ``global_step`` variable."""
        return self.library_schedule().tensor(global_step)


def steps_per_epoch(examples_per_epoch: int, global_batch_size: int) -> float:
    """Optimizer steps in one pass over the training set (a float: epochs need not end on
    a step)."""
    if examples_per_epoch < 1 or global_batch_size < 1:
        raise ValueError(
            "examples_per_epoch and global_batch_size must be >= 1, got %d and %d"
            % (examples_per_epoch, global_batch_size)
        )
    return examples_per_epoch / global_batch_size


def epochs_to_steps(epochs: float, examples_per_epoch: int, global_batch_size: int) -> int:
    """The optimizer step at which ``epochs`` passes over the training set are done."""
    steps_per_epoch(examples_per_epoch, global_batch_size)  # the checks and their message
    return towerlib.schedules.steps_for_epochs(epochs, examples_per_epoch, global_batch_size)


# Above this a CIFAR model diverges in its first steps; a larger value is a typo
# (0.1 -> 10, a missing minus in 1e-3), refused before anything is written.
MAX_LEARNING_RATE = 10.0


def settings_problem(
    base_rate: float,
    decay_epochs: Sequence[float],
    decay_factor: float,
    warmup_epochs: float,
) -> Optional[Tuple[str, object, str]]:
    """The first problem of the schedule's settings, as (train flag, value, what is
    wrong), or None. A rate <= 0 is towerlib's to refuse (validate_config's
    learning_rate); above MAX_LEARNING_RATE is this example's."""
    if not base_rate <= MAX_LEARNING_RATE:  # also refuses NaN and Inf
        return ("learning_rate", base_rate, "the learning rate must be at most %g (e.g. 0.1 "
                "for SGD with momentum on CIFAR)." % MAX_LEARNING_RATE)
    if not 0 < decay_factor <= 1:
        return ("lr_decay_factor", decay_factor, "the decay factor must be in (0, 1].")
    decay_epochs = [float(e) for e in decay_epochs]
    if any(e <= 0 for e in decay_epochs) or \
            any(later <= earlier for earlier, later in zip(decay_epochs, decay_epochs[1:])):
        return ("lr_decay_epochs", decay_epochs,
                "learning-rate decay epochs must be positive and strictly ascending (each "
                "once).")
    if not warmup_epochs >= 0:
        return ("warmup_epochs", warmup_epochs, "the warm-up must be >= 0 epochs.")
    if decay_epochs and decay_epochs[0] < warmup_epochs:
        return ("lr_decay_epochs", decay_epochs, "the first decay (epoch %g) comes before "
                "the warm-up ends (epoch %g); decay after the warm-up."
                % (decay_epochs[0], warmup_epochs))
    return None


def check_settings(base_rate, decay_epochs, decay_factor, warmup_epochs) -> List[float]:
    """Checks the schedule's settings; returns decay_epochs as floats.

    Raises:
      ValueError: with what is wrong, for a bad rate, factor or epoch list.
    """
    problem = settings_problem(base_rate, decay_epochs, decay_factor, warmup_epochs)
    if problem or not base_rate > 0:
        raise ValueError(problem[2] if problem else "The learning rate must be > 0.")
    return [float(e) for e in decay_epochs]


def make_schedule(
    base_rate: float,
    global_batch_size: int,
    examples_per_epoch: int,
    decay_epochs: Sequence[float] = (),
    decay_factor: float = 0.1,
    warmup_epochs: float = 0.0,
    scale_with_batch: bool = False,
) -> LearningRateSchedule:
    """Turns a schedule in epochs into one in global-batch steps.

    Args:
      base_rate: the rate for a global batch of REFERENCE_BATCH_SIZE when scale_with_batch,
        else the rate as it is.
      global_batch_size: examples per optimizer step, over all towers.
      examples_per_epoch: the size of the training set.
      decay_epochs: epochs at which to multiply the rate by decay_factor, ascending.
      decay_factor: in (0, 1].
      warmup_epochs: epochs of linear warm-up (0: none).
      scale_with_batch: multiply base_rate by global_batch_size / 128.

    Raises:
      ValueError: with what is wrong, for a bad rate, factor or epoch list.
    """
    decay_epochs = check_settings(base_rate, decay_epochs, decay_factor, warmup_epochs)
    if scale_with_batch:
        base_rate = towerlib.schedules.linear_scaling(
            base_rate, global_batch_size, REFERENCE_BATCH_SIZE)
    return LearningRateSchedule(
        base_rate=base_rate,
        warmup_steps=epochs_to_steps(warmup_epochs, examples_per_epoch, global_batch_size),
        boundaries=[
            epochs_to_steps(e, examples_per_epoch, global_batch_size) for e in decay_epochs
        ],
        decay_factor=decay_factor,
    )

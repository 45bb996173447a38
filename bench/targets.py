"""The numbers the benchmarks are held to, in one place.

Each target says which ratio it bounds, the bound, and where it applies
(and nothing more than how to compare a value with it). The benchmarks and
the renderer (bench/report.py) read them from here; none of them types a
bound of its own.

Two kinds:

  Target       a ratio between two configurations of bench/run.py's
               side-by-side run (towerlib against hand-written towers,
               MirroredStrategy, one device, the CIFAR input), checked per
               model and tower count in BENCHMARKS.md's "Targets" table.
  RatioTarget  a ratio one standalone benchmark prints (bench_bn_modes.py,
               bench_variable_update.py, bench_precision_memory.py,
               bench_trace.py), at the setting it names.
"""

import dataclasses
from typing import Optional, Tuple

from bench import configs as configs_lib


def _where(tower_counts):
    if tower_counts is None:
        return "every tower count"
    return "at " + ", ".join(str(t) for t in tower_counts) + " towers"


@dataclasses.dataclass(frozen=True)
class Target:
    """A ratio the issue sets a bound on, at some tower counts.

    Attributes:
      name: what is compared, as the report's row says it.
      numerator / denominator: (kind, bn_mode, input_source) of the two
        configurations in the group.
      quantity: 'step_time' (ratio of seconds per step) or 'throughput'
        (ratio of images/sec).
      bound: the limit.
      upper: True when the ratio must be <= bound, False when >= bound.
      tower_counts: where the bound applies (None: every count).
    """

    name: str
    numerator: Tuple[str, Optional[str], str]
    denominator: Tuple[str, Optional[str], str]
    quantity: str
    bound: float
    upper: bool
    tower_counts: Optional[Tuple[int, ...]] = None

    def applies_to(self, num_towers):
        return self.tower_counts is None or num_towers in self.tower_counts

    def met(self, value):
        return value <= self.bound if self.upper else value >= self.bound

    @property
    def bound_text(self):
        return f"{'<=' if self.upper else '>='} {self.bound:g} {_where(self.tower_counts)}"


# The configurations bench/run.py's targets compare: (kind, bn_mode, input_source).
TOWERLIB_FIRST = (configs_lib.TOWERLIB, "first_tower", configs_lib.SYNTHETIC_INPUT)
HANDWRITTEN = (configs_lib.HANDWRITTEN, None, configs_lib.SYNTHETIC_INPUT)
MIRRORED = (configs_lib.MIRRORED, None, configs_lib.SYNTHETIC_INPUT)
SINGLE = (configs_lib.SINGLE_DEVICE, None, configs_lib.SYNTHETIC_INPUT)
TOWERLIB_CIFAR = (configs_lib.TOWERLIB, "first_tower", configs_lib.CIFAR_FILES_INPUT)

# bench/run.py (BENCHMARKS.md's "Targets" table).
TARGETS = (
    Target("towerlib first_tower / hand-written towers, step time",
           TOWERLIB_FIRST, HANDWRITTEN, "step_time", 1.02, upper=True),
    Target("towerlib first_tower / MirroredStrategy, images/sec",
           TOWERLIB_FIRST, MIRRORED, "throughput", 1.0, upper=False),
    Target("towerlib first_tower / MirroredStrategy, images/sec",
           TOWERLIB_FIRST, MIRRORED, "throughput", 1.5, upper=False, tower_counts=(8,)),
    Target("towerlib first_tower / one device on the whole batch, step time",
           TOWERLIB_FIRST, SINGLE, "step_time", 1.10, upper=True, tower_counts=(8,)),
    Target("CIFAR files / synthetic input (towerlib first_tower), images/sec",
           TOWERLIB_CIFAR, TOWERLIB_FIRST, "throughput", 0.95, upper=False),
)


@dataclasses.dataclass(frozen=True)
class RatioTarget:
    """An upper bound on a ratio a standalone benchmark prints.

    Attributes:
      ratio: what is divided by what, as the benchmark prints it.
      bound: the ratio must be <= bound.
      where: the setting the bound is set for, in words ('8 towers').
      tower_counts: the tower counts it applies to (None: any).
      statistic: which summary of the measurements is held to the bound.
    """

    ratio: str
    bound: float
    where: str = ""
    tower_counts: Optional[Tuple[int, ...]] = None
    statistic: str = "median of the paired per-repetition ratios"

    def applies_to(self, num_towers):
        return self.tower_counts is None or num_towers in self.tower_counts

    def met(self, value):
        return value <= self.bound

    @property
    def text(self):
        """'<= 1.15x at 8 towers'."""
        return f"<= {self.bound:.2f}x" + (f" at {self.where}" if self.where else "")

    def verdict_line(self, value):
        """'target sync / first_tower step time <= 1.15x at 8 towers (...): 1.045x, met'."""
        return (f"target {self.ratio} {self.text} ({self.statistic}): {value:.3f}x, "
                f"{'met' if self.met(value) else 'MISSED'}")


# bench/bench_bn_modes.py: bn_mode='sync' (the default transport) over first_tower,
# ResNet-20 on virtual CPU towers (docs/batch_norm_modes.md).
SYNC_BATCH_NORM = RatioTarget("sync / first_tower step time", 1.15, "8 towers", (8,),
                              statistic="ratio of the median step times")

# bench/bench_variable_update.py: update='replicated' (packed, graph transport)
# over the parameter server, ResNet-20 on virtual CPU towers.
REPLICATED = RatioTarget("replicated / parameter_server step time", 1.05, "8 towers", (8,))

# bench/bench_keras.py: the CIFAR ResNet-20 as a tf_keras model through towerlib.KerasTower
# over the same network written with towerlib.layers, 4 virtual CPU towers.
KERAS_MODEL = RatioTarget("keras_resnet20 / resnet20 step time", 1.05, "4 towers", (4,))

# bench/bench_precision_memory.py: the step's memory above the baseline with
# k = 4 micro-batches over one batch of the same global batch.
ACCUMULATION_STEPS = 4
ACCUMULATION_MEMORY = RatioTarget(
    f"step memory, k = {ACCUMULATION_STEPS} micro-batches / one batch", 0.40,
    statistic="ratio of the medians over fresh processes")

# bench/bench_trace.py: a training loop with trace_steps that are never
# reached over the same loop without them ("no measurable cost").
# Held to 1.00 on the lower quartile of the paired ratios: met when the
# middle half reaches 1.00, i.e. any cost is inside the run's own noise.
UNREACHED_TRACE_HOOK = RatioTarget(
    "loop with an unreached TraceHook / without, step time", 1.0,
    statistic="lower quartile of the paired per-repetition ratios")

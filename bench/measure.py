"""Statistics over repetitions: medians, spreads, paired ratios, linear fits.

A ratio between two configurations is computed per repetition (both were
timed within the same repetition, one after the other) and the median of
those ratios is reported, with their range. A burst of load from another
program during one repetition then moves both sides of that repetition's
ratio instead of only one configuration's median.
"""

import dataclasses
import math
import statistics
from typing import List, Optional, Sequence


@dataclasses.dataclass(frozen=True)
class Summary:
    """Median, range and relative spread of some positive values."""

    median: float
    low: float
    high: float
    count: int

    @property
    def spread(self):
        """(high - low) / median: the full relative range of the repetitions."""
        return (self.high - self.low) / self.median if self.median else float("nan")


def summarize(values: Sequence[Optional[float]]) -> Optional[Summary]:
    """Summary of the values that are not None; None when there are none."""
    present = [v for v in values if v is not None]
    if not present:
        return None
    return Summary(statistics.median(present), min(present), max(present), len(present))


def images_per_second(step_seconds: Sequence[Optional[float]], global_batch: int):
    """Per-repetition throughput (None where the step time is missing)."""
    return [None if s is None else global_batch / s for s in step_seconds]


def paired_ratios(numerator: Sequence[Optional[float]],
                  denominator: Sequence[Optional[float]]) -> List[float]:
    """numerator[i] / denominator[i] for each repetition where both were measured."""
    return [a / b for a, b in zip(numerator, denominator)
            if a is not None and b is not None and b > 0]


def ratio_summary(numerator, denominator) -> Optional[Summary]:
    return summarize(paired_ratios(numerator, denominator))


def linear_fit(xs: Sequence[float], ys: Sequence[float]):
    """Least-squares (slope, intercept, r2) of ys against xs; None with < 2 points."""
    if len(xs) < 2:
        return None
    mean_x = sum(xs) / len(xs)
    mean_y = sum(ys) / len(ys)
    sxx = sum((x - mean_x) ** 2 for x in xs)
    if sxx == 0:
        return None
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys))
    slope = sxy / sxx
    intercept = mean_y - slope * mean_x
    total = sum((y - mean_y) ** 2 for y in ys)
    residual = sum((y - (intercept + slope * x)) ** 2 for x, y in zip(xs, ys))
    r2 = 1.0 - residual / total if total > 0 else 1.0
    return slope, intercept, r2


def is_positive_finite(value):
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0

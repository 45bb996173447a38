"""Clipping by the global norm of the whole step's gradient, the same on every copy.

    train = towerlib.build_train_graph(model, batch, optimizer, num_towers=4,
                                       clipping=towerlib.ClipByGlobalNorm(5.0))

Users of tower loops clip in each tower and then average; the norm is then
a tower's, not the global batch's, and N towers no longer take one device's
step. towerlib clips after the towers' gradients are combined (summed over
towers, micro-batches and workers, and unscaled under float16): the norm
is that of the gradient one device computes on the whole global batch, as
`tf.clip_by_global_norm` on that device would take it. It is computed once,
from tower 0's combined gradients (every copy holds the same sum), and the
one factor min(1, clip_norm / norm) scales every copy's gradients, so
replicated copies stay bit-identical.

A sparse gradient (IndexedSlices) counts by its dense value: rows of a
repeated index are summed before squaring, as the dense gradient has them.
"""

import dataclasses
import numbers
import warnings

import tensorflow as tf

from towerlib.update.base import CombinedGradients

__all__ = ["CLIP_NORM_FLOOR", "ClipByGlobalNorm", "clip_combined", "resolve_clipping"]

# Below this a clipped step is at most rate * 1e-6 long: weights of size 1 in float32
# (whose precision is 6e-8) barely move or never do, which reads as a silent no-op.
CLIP_NORM_FLOOR = 1e-6


@dataclasses.dataclass(frozen=True)
class ClipByGlobalNorm:
    """Scale the step's gradients by min(1, clip_norm / global_norm).

    Attributes:
      clip_norm: a finite number > 0. Below CLIP_NORM_FLOOR (1e-6) it warns: the
        step is then so short that float32 weights may never move.
    """

    clip_norm: float

    def __post_init__(self):
        value = self.clip_norm
        if (isinstance(value, bool) or not isinstance(value, numbers.Real)
                or not value > 0 or value == float("inf")):
            raise ValueError(f"ClipByGlobalNorm(clip_norm={value!r}) is not a norm. "
                             "Fix: a finite number > 0, e.g. ClipByGlobalNorm(5.0).")
        object.__setattr__(self, "clip_norm", float(value))
        if value < CLIP_NORM_FLOOR:
            warnings.warn(f"ClipByGlobalNorm(clip_norm={value!r}) is below {CLIP_NORM_FLOOR:g}: "
                          "every step is at most rate * clip_norm long, and float32 weights "
                          "may never move. Fix: a norm like 1.0 or 5.0.", stacklevel=3)


def resolve_clipping(clipping):
    """None, or a ClipByGlobalNorm; anything else is refused in one line."""
    if clipping is None or isinstance(clipping, ClipByGlobalNorm):
        return clipping
    if isinstance(clipping, type) and issubclass(clipping, ClipByGlobalNorm):
        raise TypeError("clipping=ClipByGlobalNorm is the class. Fix: "
                        "clipping=towerlib.ClipByGlobalNorm(5.0).")
    raise TypeError(f"clipping must be None or towerlib.ClipByGlobalNorm(clip_norm), got "
                    f"{clipping!r}. Fix: e.g. clipping=towerlib.ClipByGlobalNorm(5.0).")


def clip_combined(combined: CombinedGradients, clipping: ClipByGlobalNorm, host):
    """(the combined gradients clipped alike on every copy, the global norm before).

    The norm is a float32 scalar computed on `host` from tower 0's pairs.
    """
    with tf.name_scope("clip_by_global_norm"):
        gradients = [g for g, _ in combined.reported if g is not None]
        with tf.device(host):
            norm = tf.sqrt(tf.add_n([_squared_sum(g) for g in gradients])
                           if gradients else tf.constant(0.0))
            clip = tf.constant(clipping.clip_norm, tf.float32)
            # min(1, c / norm), written so that a zero norm scales by 1, not NaN.
            factor = clip / tf.maximum(norm, clip)

        def scaled(pairs):
            return [(None if g is None else _scale(g, factor), v) for g, v in pairs]

        return combined.map_pairs(scaled), norm


def _squared_sum(gradient):
    with tf.device(gradient.device):
        if isinstance(gradient, tf.IndexedSlices):
            unique, position = tf.unique(gradient.indices)
            rows = tf.math.unsorted_segment_sum(gradient.values, position, tf.size(unique))
            return tf.reduce_sum(tf.square(tf.cast(rows, tf.float32)))
        return tf.reduce_sum(tf.square(tf.cast(gradient, tf.float32)))


def _scale(gradient, factor):
    with tf.device(gradient.device):
        if isinstance(gradient, tf.IndexedSlices):
            return tf.IndexedSlices(gradient.values * tf.cast(factor, gradient.dtype),
                                    gradient.indices, gradient.dense_shape)
        return gradient * tf.cast(factor, gradient.dtype)

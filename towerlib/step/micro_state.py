"""Values kept across the micro-batches of one step, in step-local variables.

The accumulation loop's body (towerlib.step.micro_loop) is built once; what
one iteration hands to the next (summed gradients, pooled batch-norm
moments, loss totals) is known only while it is built, so it cannot be the
loop's carried tensors, which are fixed before. It is kept in variables
instead, made here as the body asks for them:

- created outside the loop (tf.init_scope), in LOCAL_VARIABLES (never
  saved), on the device of the tower whose value they hold;
- micro-batch 0 assigns, later micro-batches combine (add, append, pool),
  so the first read of a step is after its first write: nothing is zeroed
  and nothing of an earlier, interrupted step is read;
- all of one device's writes are one tf.cond on "is this micro-batch 0",
  whose branches hold that device's assigns: a write never moves a value
  to another device.

    state = StepState(is_first, devices)
    state.add(("loss", 0), weighted_loss, tower_index=0)
    writes = state.write()             # the loop's counter waits for these
    # after the loop, under its control dependency:
    total = state.read(("loss", 0))
"""

import collections
import dataclasses
import re
from typing import Any, Callable, List

import tensorflow as tf

from towerlib.batchnorm import normalization

__all__ = ["StepState"]


@dataclasses.dataclass
class _Kept:
    """Variables holding one value, and how a later micro-batch combines into them."""

    variables: List[tf.Variable]
    values: List[tf.Tensor]
    combine: Callable  # (old values, new values) -> new variable values, or None: keep
    static_shapes: List[Any]


class StepState:
    """Step-local variables written once per micro-batch, read after the loop.

    Args:
      is_first: bool scalar of the body, whether this is micro-batch 0.
      devices: the towers' devices; a value of tower i lives on devices[i].
    """

    def __init__(self, is_first, devices):
        self._is_first = is_first
        self._devices = list(devices)
        self._kept = collections.OrderedDict()     # key -> _Kept
        self._device_of = {}                       # key -> tower index

    def add(self, key, value, tower_index, static_shape=None):
        """Keeps sum_j value_j (a tensor of fixed shape)."""
        shape = value.shape if value.shape.is_fully_defined() else tf.TensorShape(static_shape)
        self._keep(key, [value], tower_index, [shape],
                   lambda old, new: [old[0] + new[0]])

    def append(self, key, value, tower_index):
        """Keeps every micro-batch's `value` concatenated along axis 0 (sparse rows)."""
        shape = tf.TensorShape([None]).concatenate(value.shape[1:])
        self._keep(key, [value], tower_index, [shape],
                   lambda old, new: [tf.concat([old[0], new[0]], axis=0)])

    def keep_first(self, key, value, tower_index):
        """Keeps micro-batch 0's `value` (the same in every micro-batch)."""
        self._keep(key, [value], tower_index, [value.shape], None)

    def pool(self, key, statistics, tower_index):
        """Keeps the pooled (count, mean, variance) of a BatchNormStatistics per micro-batch."""
        values = [tf.cast(statistics.count, tf.float32), statistics.mean, statistics.variance]

        def combine(old, new):
            pooled = normalization.pooled_statistics([_Moments(*old), _Moments(*new)])
            return list(pooled)

        self._keep(key, values, tower_index, [v.shape for v in values], combine)

    def write(self) -> List[tf.Tensor]:
        """One cond per device: assign at micro-batch 0, combine after. Returns their outputs."""
        by_device = collections.OrderedDict()
        for key, kept in self._kept.items():
            by_device.setdefault(self._device_of[key], []).append(kept)
        written = []
        for tower_index, kept_here in by_device.items():
            device = self._devices[tower_index]

            def assign(kept_list=kept_here, device=device, first=True):
                updates = []
                with tf.device(device):
                    for kept in kept_list:
                        if first:
                            new = kept.values
                        elif kept.combine is None:
                            continue
                        else:
                            new = kept.combine([v.read_value() for v in kept.variables],
                                               kept.values)
                        updates.extend(variable.assign(value, read_value=False)
                                       for variable, value in zip(kept.variables, new))
                    with tf.control_dependencies(updates):
                        return tf.constant(True)

            with tf.device(device):
                written.append(tf.cond(
                    self._is_first, assign, lambda assign=assign: assign(first=False),
                    name=f"keep_tower_{tower_index}"))
        return written

    def variables(self):
        """Every variable kept, in the order asked for."""
        return tuple(v for kept in self._kept.values() for v in kept.variables)

    def read(self, key) -> tf.Tensor:
        """The kept value (call after the loop, under its control dependency)."""
        return self._read(key)[0]

    def read_pooled(self, key):
        """(count, mean, variance) kept by pool()."""
        return tuple(self._read(key))

    # ----------------------------------------------------------------- internals

    def _keep(self, key, values, tower_index, shapes, combine):
        if key in self._kept:
            raise ValueError(f"StepState: {key!r} is kept twice.")
        variables = []
        name = "kept_" + re.sub(r"[^A-Za-z0-9_.\-]", "_", "_".join(str(k) for k in key))
        with tf.device(self._devices[tower_index]), tf.init_scope():
            for value, shape in zip(values, shapes):
                initial = tf.zeros([d if d is not None else 0 for d in shape.as_list()]
                                   if shape.rank is not None else [0], value.dtype)
                variables.append(tf.compat.v1.Variable(
                    initial, trainable=False, name=name, use_resource=True,
                    collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES],
                    validate_shape=shape.is_fully_defined(),
                    shape=shape if shape.is_fully_defined() else tf.TensorShape(None)))
        self._kept[key] = _Kept(variables, values, combine, shapes)
        self._device_of[key] = tower_index

    def _read(self, key):
        kept = self._kept[key]
        reads = []
        for variable, shape in zip(kept.variables, kept.static_shapes):
            with tf.device(variable.device):
                value = variable.read_value()
            value.set_shape(shape)
            reads.append(value)
        return reads


@dataclasses.dataclass
class _Moments:
    count: tf.Tensor
    mean: tf.Tensor
    variance: tf.Tensor

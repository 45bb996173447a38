"""The tower context: what one replica of the tower function knows about itself.

A `TowerContext` is handed explicitly to every tower function and to the
layers that behave differently per tower (batch norm, dropout). Nothing is read
from a global: two builds in one graph, or an evaluation graph next to a
training graph, cannot see each other's state.
"""

import collections
import dataclasses
from typing import Any, Optional

import tensorflow as tf

from towerlib.batchnorm.modes import BN_MODES, BnMode, resolve_bn_mode

__all__ = ["BN_MODES", "BnMode", "TowerContext", "TowerRecords"]


class TowerRecords:
    """What the towers of one build report back to the builder.

    Towers append; the builder reads after every tower is built. Keys are
    layer names (variable-scope names), so the same layer in every tower
    lands under one key.
    """

    def __init__(self, num_towers):
        self.num_towers = num_towers
        # layer name -> [BatchNormStatistics, ...] in tower order.
        self.batch_norm = collections.OrderedDict()
        # scalar name -> [(tower_index, value), ...]
        self.scalars = collections.OrderedDict()

    def add_batch_norm(self, layer_name, statistics):
        self.batch_norm.setdefault(layer_name, []).append(statistics)

    def check_batch_norm_in_every_tower(self):
        """Refuses a batch-norm layer that some towers built and others did not.

        Under `if ctx.index == 0:` the towers would train different models
        (and with sync batch norm, wait for each other); every tower must call
        the same layers. With accumulation each micro-batch adds one entry per
        tower, so every tower must have as many.
        """
        for layer, statistics in self.batch_norm.items():
            counts = collections.Counter(s.tower_index for s in statistics)
            if len({counts.get(t, 0) for t in range(self.num_towers)}) > 1:
                missing = [t for t in range(self.num_towers)
                           if counts.get(t, 0) < max(counts.values())]
                raise ValueError(
                    f"Batch-norm layer '{layer}' was built by towers "
                    f"{sorted(counts)} but not (or less often) by towers {missing}. "
                    "Every tower must call the same layers the same number of times: "
                    "do not make a layer depend on ctx.index or ctx.is_first, or the "
                    "towers train different models.")

    def add_scalar(self, name, tower_key, value):
        """tower_key: (micro-batch, tower index), which the builder's shares are keyed by."""
        self.scalars.setdefault(name, []).append((tower_key, value))


@dataclasses.dataclass(frozen=True)
class TowerContext:
    """Identity and mode of one tower.

    Attributes:
      index: 0-based tower number.
      num_towers: how many towers this build has.
      device: the device the tower's ops run on, e.g. '/device:GPU:1'.
      is_training: whether layers run in training mode (batch statistics,
        dropout) or inference mode (moving statistics, no dropout).
      bn_mode: how batch norm treats the towers, a towerlib.BnMode (given as
        one, or as its name in BN_MODES, resolved here for a context made by
        hand; it compares equal to its name, so a tower function comparing it
        with 'sync' works).
      name_scope: the tower's name scope, e.g. 'tower_1/'.
      batch_size: int32 scalar tensor, this tower's number of examples, or
        None when the builder does not know it.
      records: the build's shared `TowerRecords`, or None when the layers are
        used outside a builder (then batch norm puts its moving-average
        updates into the UPDATE_OPS collection, as plain TF 1 code expects).
      cross_tower: the build's cross-tower reducer for bn_mode='sync', else None.
      micro_batch: with gradient accumulation (accumulation_steps=k), which of
        the step's k micro-batches an input function is called for, 0..k-1;
        else 0. The tower function is built once for every micro-batch (a
        loop, towerlib.step.micro_loop) and sees 0.
      compute_dtype: the dtype the tower computes its activations in (the
        build's `precision`): tf.float32, tf.bfloat16 or tf.float16. towerlib
        casts the inputs and get_variable's weights to it; a Keras model
        takes it as its mixed-precision policy (towerlib.KerasTower).
    """

    index: int = 0
    num_towers: int = 1
    device: str = ""
    is_training: bool = True
    bn_mode: Any = "first_tower"
    name_scope: str = ""
    batch_size: Optional[tf.Tensor] = None
    records: Optional[TowerRecords] = None
    cross_tower: Any = None
    micro_batch: int = 0
    compute_dtype: tf.DType = tf.float32

    def __post_init__(self):
        object.__setattr__(self, "bn_mode", resolve_bn_mode(self.bn_mode))
        if not 0 <= self.index < self.num_towers:
            raise ValueError(
                f"Tower index {self.index} is outside 0..{self.num_towers - 1}.")

    @property
    def is_first(self):
        """True for tower 0, the tower that creates the variables."""
        return self.index == 0

    @classmethod
    def single(cls, is_training=True, bn_mode="first_tower"):
        """A context for using towerlib layers on one device, without a builder."""
        return cls(is_training=is_training, bn_mode=bn_mode)

"""A copy of every variable per tower; the towers' gradients all-reduced.

    update = towerlib.Replicated()                         # float32 on the wire
    update = towerlib.Replicated(pack_bytes=1 << 20, wire_dtype="bfloat16")
    train = towerlib.build_train_graph(model, batch, optimizer, update=update)

Every tower holds its own copy of every variable on its own device
(towerlib.update.copies), so no weight crosses between devices in a step.
The towers' gradients are summed by an all-reduce (towerlib.update.allreduce)
through the same cross-tower exchange as sync batch norm (NCCL between GPUs),
and each tower applies the sum to its own copy with its own optimizer slots.
It computes the parameter server's update; what differs is what crosses
between devices (bench/traffic.py counts it from the built graph).

`pack_bytes`: dense gradients are packed into all-reduce buffers of at most
this many bytes (0: one exchange per gradient). `wire_dtype`: None sends the
float32 gradients as they are; 'bfloat16' or 'float16' sends and sums them
in that type (half the bytes, sums rounded to it), cast back to float32
before the update, whatever the compute dtype (Horovod's fp16 compression).
"""

import dataclasses
import logging
import numbers
from typing import Optional

import tensorflow as tf

from towerlib.update import allreduce
from towerlib.update import copies as variable_copies
from towerlib.update.base import CombinedGradients, UpdateChoice, VariableUpdate

__all__ = ["DEFAULT_PACK_BYTES", "WIRE_DTYPES", "Replicated", "ReplicatedUpdate",
           "warn_missing_gradients"]

logger = logging.getLogger("towerlib")

# Dense gradients are packed into all-reduce buffers of at most this size.
DEFAULT_PACK_BYTES = 4 << 20

WIRE_DTYPES = ("float32", "bfloat16", "float16")


@dataclasses.dataclass(frozen=True)
class Replicated(UpdateChoice):
    """A copy of the variables per tower, the gradients all-reduced.

    Attributes:
      pack_bytes: all-reduce buffer size for dense gradients, >= 0 (0: none).
      wire_dtype: None or 'float32' (as computed), 'bfloat16' or 'float16'.
      shard_update: each weight's optimizer update (and its slots) on one owner
        tower only, the result copied to the others (towerlib.update.sharded);
        across workers, one owner among every tower of every worker.
    """

    pack_bytes: int = DEFAULT_PACK_BYTES
    wire_dtype: Optional[str] = None
    shard_update: bool = False
    name = "replicated"

    def __post_init__(self):
        if (isinstance(self.pack_bytes, bool)
                or not isinstance(self.pack_bytes, numbers.Integral) or self.pack_bytes < 0):
            raise ValueError(f"Replicated(pack_bytes={self.pack_bytes!r}) is not a size. "
                             "Fix: a size in bytes >= 0 (0: one all-reduce per gradient).")
        object.__setattr__(self, "pack_bytes", int(self.pack_bytes))  # numpy ints too
        wire = self.wire_dtype
        if isinstance(wire, tf.DType):
            wire = wire.name
        if wire is not None and wire not in WIRE_DTYPES:
            raise ValueError(f"Replicated(wire_dtype={self.wire_dtype!r}) is not a wire "
                             "dtype. Fix: None (float32), 'bfloat16' or 'float16'.")
        object.__setattr__(self, "wire_dtype", None if wire == "float32" else wire)
        if not isinstance(self.shard_update, bool):
            raise TypeError(f"Replicated(shard_update={self.shard_update!r}) is not a bool. "
                            "Fix: shard_update=True or False.")

    @property
    def exchanges_gradients(self):
        return True

    def build(self, num_towers, reducer):
        wire = None if self.wire_dtype is None else tf.as_dtype(self.wire_dtype)
        if not self.shard_update:
            return ReplicatedUpdate(num_towers, reducer, self.pack_bytes, wire)
        from towerlib.update import sharded  # below: it extends ReplicatedUpdate
        return sharded.ShardedUpdate(num_towers, reducer, self.pack_bytes, wire)


def warn_missing_gradients(pairs):
    """A warning for each variable of tower 0's (gradient, variable) pairs without one."""
    for gradient, variable in pairs:
        if gradient is None:
            logger.warning(
                "Variable %s has no gradient in any tower; it is left out of "
                "the update. Check that it feeds the loss.", variable.name)


class ReplicatedUpdate(VariableUpdate):
    """Replicated's hooks for one build (towerlib.update.base).

    Args:
      num_towers: the towers of the build.
      reducer: the build's CrossTowerReducer (None for one tower).
      pack_bytes: buffer size for packing dense gradients (0: none).
      wire_dtype: None (all-reduce in float32) or the half compute dtype.
    """

    name = "replicated"
    param_device = None  # each tower's variables on the tower's own device

    def __init__(self, num_towers, reducer, pack_bytes, wire_dtype=None):
        self._copies = variable_copies.VariableCopies(num_towers)
        self._reducer = reducer
        self._pack_bytes = pack_bytes
        self._wire_dtype = wire_dtype

    def variable_getter(self, tower_index):
        """The custom getter that gives tower `tower_index` its own copies."""
        return self._copies.getter_for(tower_index)

    def check_towers(self, towers):
        """Refuses update ops the tower function made itself (not towerlib's)."""
        for tower in towers:
            if tower.update_ops:
                names = ", ".join(sorted(op.name for op in tower.update_ops)[:5])
                raise ValueError(
                    f"Tower {tower.context.index} put its own ops in UPDATE_OPS "
                    f"({names}). With update='replicated' each tower has its "
                    "own copy of every variable, and such an op would update only "
                    "its tower's copy, so the copies would drift apart. Use towerlib's "
                    "batch norm (towerlib.batch_norm, or "
                    "towerlib.layers.for_tower(ctx).batch_normalization), which updates "
                    "every copy alike, or update='parameter_server'.")

    def tower_variables(self, var_list, tower_index):
        """Tower `tower_index`'s copies of `var_list` (tower 0's variables)."""
        if tower_index == 0:
            self._copies.check_every_variable_has_copies(var_list)
        return self._copies.tower_variables(var_list, tower_index)

    def combine(self, tower_grads_and_vars, riders=None):
        """Every tower's (summed gradient, own copy) pairs, tower 0's first.

        `tower_grads_and_vars` has one list per tower (with accumulation, each
        tower's sum over its micro-batches: towerlib.step.micro_loop); the
        towers' gradients are all-reduced once per step, `riders` with them.
        """
        if riders is not None and self._reducer is None:
            raise ValueError("Replicated.combine: riders need an exchange between towers.")
        tower_gradients = [[g for g, _ in pairs] for pairs in tower_grads_and_vars]
        warn_missing_gradients(tower_grads_and_vars[0])
        if self._reducer is not None:
            with tf.name_scope("allreduce_gradients"):
                tower_gradients = allreduce.allreduce_gradients(
                    self._reducer, tower_gradients, self._pack_bytes, self._wire_dtype,
                    riders=riders)
            if riders is not None:
                tower_gradients, riders = tower_gradients
        # Tower 0's pairs first: the optimizer creates tower 0's slots before
        # the other towers' copies of them, which read tower 0's.
        per_tower = [[(gradient, variable)
                      for gradient, (_, variable) in zip(gradients, grads_and_vars)
                      if gradient is not None]
                     for gradients, grads_and_vars in zip(tower_gradients,
                                                          tower_grads_and_vars)]
        return CombinedGradients(per_tower, riders=riders)

    def apply(self, optimizer, pairs, global_step):
        """One apply op updating every copy; the copies' slots are local copies too."""
        scope = tf.compat.v1.get_variable_scope()
        with tf.compat.v1.variable_scope(scope, custom_getter=self._copies.slot_getter,
                                         auxiliary_name_scope=False):
            return optimizer.apply_gradients(pairs, global_step=global_step)

    def sync_op(self):
        """Copies tower 0's values into every other tower's copies (after apply)."""
        return self._copies.sync_op()

    @property
    def copies(self):
        """{tower 0's variable name: [every tower's copy]}, slots included."""
        return {name: self._copies.copies_of(name) for name in self._copies.names}

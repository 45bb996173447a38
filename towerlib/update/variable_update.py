"""How the towers' gradients reach the variables: one small class per way.

Both ways compute the same update, one optimizer step on the mean loss of
the global batch; they differ in what crosses between devices each step
(bench/traffic.py counts it from the built graph).

  'parameter_server' (default): one copy of every variable, on the host CPU,
      spread over the GPUs, or where a device function says. Every tower
      reads every variable and sends its gradient to the variable's device,
      where the gradients are summed and applied once.
  'replicated': every tower holds its own copy of every variable on its own
      device (towerlib.update.copies). The towers' gradients are summed by
      an all-reduce (towerlib.update.allreduce, through the same cross-tower exchange
      as sync batch norm: NCCL between GPUs); each tower applies the summed
      gradient to its own copy with its own optimizer slots.

    update = make_variable_update("replicated", devices, param_device=None,
                                  reducer=reducer, gradient_pack_bytes=4 << 20)
    towers = build_towers(..., param_device=update.param_device,
                          variable_getter=update.variable_getter)
    grads = [optimizer.compute_gradients(objective_i,
                                         update.tower_variables(var_list, i)) ...]
    pairs, grads_and_vars = update.combine(grads)
    apply_op = update.apply(optimizer, pairs, global_step)
"""

import logging

import tensorflow as tf

from towerlib.update import allreduce
from towerlib.update import aggregation as gradients_lib
from towerlib.update import copies as variable_copies

__all__ = ["DEFAULT_GRADIENT_PACK_BYTES", "VARIABLE_UPDATES", "ParameterServerUpdate",
           "ReplicatedUpdate", "make_variable_update"]

logger = logging.getLogger("towerlib")

VARIABLE_UPDATES = ("parameter_server", "replicated")

# Dense gradients are packed into all-reduce buffers of at most this size.
DEFAULT_GRADIENT_PACK_BYTES = 4 << 20


class ParameterServerUpdate:
    """One copy of every variable; gradients summed on each variable's device."""

    name = "parameter_server"
    variable_getter = None  # towers reuse tower 0's variables as they are

    def __init__(self, param_device):
        self.param_device = "cpu" if param_device is None else param_device

    def check_towers(self, towers):
        del towers  # every kind of update op works on shared variables

    def tower_variables(self, var_list, tower_index):
        del tower_index
        return var_list

    def combine(self, tower_grads_and_vars):
        """The summed (gradient, variable) pairs, once: (to apply, to report)."""
        grads_and_vars = gradients_lib.aggregate_gradients(tower_grads_and_vars)
        return grads_and_vars, grads_and_vars

    def apply(self, optimizer, pairs, global_step):
        """One apply op on the shared variables."""
        return optimizer.apply_gradients(pairs, global_step=global_step)

    def sync_op(self):
        return None  # one copy: nothing to keep in step

    @property
    def copies(self):
        return {}


class ReplicatedUpdate:
    """A copy of every variable per tower; gradients all-reduced.

    Args:
      num_towers: the towers of the build.
      reducer: the build's CrossTowerReducer (None for one tower).
      gradient_pack_bytes: buffer size for packing dense gradients (0: none).
      wire_dtype: None (all-reduce in float32) or the half compute dtype.
    """

    name = "replicated"
    param_device = None  # each tower's variables on the tower's own device

    def __init__(self, num_towers, reducer, gradient_pack_bytes, wire_dtype=None):
        self._copies = variable_copies.VariableCopies(num_towers)
        self._reducer = reducer
        self._pack_bytes = gradient_pack_bytes
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
                    f"({names}). With variable_update='replicated' each tower has its "
                    "own copy of every variable, and such an op would update only "
                    "its tower's copy, so the copies would drift apart. Use towerlib's "
                    "batch norm (towerlib.batch_norm, or "
                    "towerlib.layers.for_tower(ctx).batch_normalization), which updates "
                    "every copy alike, or variable_update='parameter_server'.")

    def tower_variables(self, var_list, tower_index):
        """Tower `tower_index`'s copies of `var_list` (tower 0's variables)."""
        if tower_index == 0:
            self._copies.check_every_variable_has_copies(var_list)
        return self._copies.tower_variables(var_list, tower_index)

    def combine(self, tower_grads_and_vars):
        """(every tower's (summed gradient, copy) pairs, tower 0's pairs to report).

        `tower_grads_and_vars` lists the towers of every micro-batch, micro-batch
        major; each tower first sums its own micro-batches, then the towers'
        sums are all-reduced once per step.
        """
        tower_grads_and_vars = self._sum_micro_batches(tower_grads_and_vars)
        tower_gradients = [[g for g, _ in pairs] for pairs in tower_grads_and_vars]
        for gradient, variable in tower_grads_and_vars[0]:
            if gradient is None:
                logger.warning(
                    "Variable %s has no gradient in any tower; it is left out of "
                    "the update. Check that it feeds the loss.", variable.name)
        if self._reducer is not None:
            with tf.name_scope("allreduce_gradients"):
                tower_gradients = allreduce.allreduce_gradients(
                    self._reducer, tower_gradients, self._pack_bytes, self._wire_dtype)
        # Tower 0's pairs first: the optimizer creates tower 0's slots before
        # the other towers' copies of them, which read tower 0's.
        per_tower = [[(gradient, variable)
                      for gradient, (_, variable) in zip(gradients, grads_and_vars)
                      if gradient is not None]
                     for gradients, grads_and_vars in zip(tower_gradients,
                                                          tower_grads_and_vars)]
        return [pair for pairs in per_tower for pair in pairs], per_tower[0]

    def _sum_micro_batches(self, tower_grads_and_vars):
        num_towers = self._copies.num_towers
        if len(tower_grads_and_vars) == num_towers:
            return tower_grads_and_vars
        summed = []
        for index in range(num_towers):
            own = tower_grads_and_vars[index::num_towers]
            pairs = []
            with tf.name_scope(f"accumulate_tower_{index}"):
                for position, (_, variable) in enumerate(own[0]):
                    gradients = [micro[position][0] for micro in own
                                 if micro[position][0] is not None]
                    with tf.device(variable.device):
                        pairs.append((gradients_lib.sum_gradients(gradients)
                                      if gradients else None, variable))
            summed.append(pairs)
        return summed

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


def check_variable_update(variable_update, param_device, gradient_pack_bytes):
    """Refuses an unknown way, a placement replicated copies cannot have, a bad size."""
    if variable_update not in VARIABLE_UPDATES:
        raise ValueError(
            f"variable_update must be one of {VARIABLE_UPDATES}, got {variable_update!r}.")
    if variable_update == "replicated" and param_device is not None:
        raise ValueError(
            f"variable_update='replicated' puts each tower's copy of the variables on "
            f"the tower's own device, so param_device={param_device!r} cannot apply; "
            "leave param_device unset, or use variable_update='parameter_server'.")
    if (isinstance(gradient_pack_bytes, bool) or not isinstance(gradient_pack_bytes, int)
            or gradient_pack_bytes < 0):
        raise ValueError(f"gradient_pack_bytes must be an int >= 0 (0: no packing), "
                         f"got {gradient_pack_bytes!r}.")


def make_variable_update(variable_update, num_towers, param_device, reducer,
                         gradient_pack_bytes=DEFAULT_GRADIENT_PACK_BYTES, wire_dtype=None):
    """The update object for `variable_update`, after check_variable_update."""
    check_variable_update(variable_update, param_device, gradient_pack_bytes)
    if variable_update == "replicated":
        return ReplicatedUpdate(num_towers, reducer, gradient_pack_bytes, wire_dtype)
    return ParameterServerUpdate(param_device)

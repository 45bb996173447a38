"""Replicated variables with the optimizer sharded: each tower updates 1/N of them.

    update = towerlib.Replicated(shard_update=True)
    train = towerlib.build_train_graph(model, batch, optimizer, num_towers=4, update=update)

As under Replicated(), every tower holds a copy of every weight and the towers'
gradients are summed. Then, instead of N towers each applying the whole update
with slots for every weight, each weight has ONE owner tower: only the owner
applies the optimizer to its copy, so only the owner holds that weight's slots
(Adam's m and v), and the updated value is copied into the other towers' copies
(the all-gather), after the apply and before anything reads the weights.

Shards are whole variables (a per-layer trust ratio, LARS or LAMB, sees its whole
layer), balanced by the rule "largest variable first, onto the tower holding the
fewest bytes so far" (ties: the lower tower, then the name): with N towers no
tower holds more than 1/N of the bytes plus one variable.

    variables 6 MB, 4 MB, 3 MB, 2 MB, 1 MB on 2 towers:
    tower 0 <- 6 MB, then 2 MB (8 MB); tower 1 <- 4 MB, 3 MB, then 1 MB (8 MB)

Names. A slot carries the plain name it has without sharding ('w/Adam'), on its
owner's device, and is saved: a sharded checkpoint restores into an unsharded
run and back, onto any number of towers (the owners are recomputed; a slot is
one variable by name, wherever it lives).
"""

import dataclasses
from typing import Dict

import tensorflow as tf

from towerlib.update import copies as variable_copies
from towerlib.update.replicated import ReplicatedUpdate

__all__ = ["ShardedUpdate", "owners_by_bytes"]


def owners_by_bytes(sizes: Dict[str, int], num_towers: int) -> Dict[str, int]:
    """{variable name: owner tower} by the balance rule (module docstring).

    Args:
      sizes: {plain variable name: its bytes}.
      num_towers: N >= 1.
    """
    held = [0] * num_towers
    owners = {}
    for name in sorted(sizes, key=lambda n: (-sizes[n], n)):
        tower = min(range(num_towers), key=lambda t: (held[t], t))
        owners[name] = tower
        held[tower] += sizes[name]
    return owners


class ShardedUpdate(ReplicatedUpdate):
    """Replicated(shard_update=True)'s hooks for one build (towerlib.update.base).

    Placement and the towers' gradients are Replicated's; `combine` keeps each
    weight's sum on its owner, `apply` applies it there, then copies the result.
    """

    name = "replicated"

    def __init__(self, num_towers, reducer, pack_bytes, wire_dtype=None):
        super().__init__(num_towers, reducer, pack_bytes, wire_dtype)
        self.owners: Dict[str, int] = {}  # plain name -> owner tower, set by combine

    def combine(self, tower_grads_and_vars, riders=None):
        """Replicated's sum; each tower then keeps the pairs of the weights it owns.

        Only the owner's summed gradient is read afterwards (clipping's norm, the
        loss scale's check, the apply), so with the graph transport the sum reaches
        the owner alone: a reduce, not an all-reduce.
        """
        combined = super().combine(tower_grads_and_vars, riders)
        tower_0 = combined.per_copy[0]
        self.owners = owners_by_bytes({v.op.name: _bytes_of(v) for _, v in tower_0},
                                      self._copies.num_towers)
        per_tower = [[] for _ in combined.per_copy]
        owned = []
        for position, (_, variable) in enumerate(tower_0):
            owner = self.owners[variable.op.name]
            gradient, copy = combined.per_copy[owner][position]
            per_tower[owner].append((gradient, copy))
            owned.append((gradient, variable))
        return dataclasses.replace(combined, per_copy=per_tower, owned=owned)

    def apply(self, optimizer, pairs, global_step):
        """The owners' apply, then every other copy set to its owner's new value."""
        scope = tf.compat.v1.get_variable_scope()
        with tf.compat.v1.variable_scope(scope, custom_getter=self._slot_on_owner,
                                         auxiliary_name_scope=False):
            apply_op = optimizer.apply_gradients(pairs, global_step=global_step)
        with tf.control_dependencies([apply_op]), tf.name_scope("gather_updated_shards"):
            gathers = self._gathers([variable for _, variable in pairs])
        return tf.group(apply_op, *gathers, name="sharded_apply")

    def _gathers(self, updated):
        """Every other copy of each updated copy assigned its value, on its own device."""
        assigns = []
        for source in updated:
            with tf.device(source.device):
                value = source.read_value()
            for copy in self._copies.copies_of(variable_copies.plain_name(source.op.name)):
                if copy is not source:
                    with tf.device(copy.device):
                        assigns.append(copy.assign(value, read_value=False))
        return assigns

    def _slot_on_owner(self, getter, name, *args, **kwargs):
        """A slot of an owner's copy gets the plain name, as a saved variable.

        The optimizer asks for 'replicated/tower_i/w/Adam/' for tower i's copy of
        'w'; it is created as 'w/Adam' (colocated with the copy by the optimizer),
        the slot an unsharded run saves.
        """
        plain = variable_copies.plain_name(name.rstrip("/"))
        return getter(plain + ("/" if name.endswith("/") else ""), *args, **kwargs)

    def sync_op(self):
        """Copies tower 0's weights into every other tower's copies (after a restore)."""
        return self._copies.sync_op()


def _bytes_of(variable):
    shape = variable.shape
    count = shape.num_elements() if shape.is_fully_defined() else 0
    return count * variable.dtype.base_dtype.size

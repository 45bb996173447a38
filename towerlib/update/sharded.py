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

from typing import Dict, List

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

    Placement, the towers' gradients and their sum are Replicated's; `apply`
    applies each weight's gradient on its owner only, then copies the result.
    """

    name = "replicated"

    def __init__(self, num_towers, reducer, pack_bytes, wire_dtype=None):
        super().__init__(num_towers, reducer, pack_bytes, wire_dtype)
        self.owners: Dict[str, int] = {}  # plain name -> owner tower, set by apply

    def apply(self, optimizer, pairs, global_step):
        """The owners' apply, then every other copy set to its owner's new value."""
        by_name = self._pairs_by_name(pairs)
        self.owners = owners_by_bytes(
            {name: _bytes_of(copies[0][1]) for name, copies in by_name.items()},
            self._copies.num_towers)
        owned = [copies[self.owners[name]] for name, copies in by_name.items()]
        scope = tf.compat.v1.get_variable_scope()
        with tf.compat.v1.variable_scope(scope, custom_getter=self._slot_on_owner,
                                         auxiliary_name_scope=False):
            apply_op = optimizer.apply_gradients(owned, global_step=global_step)
        with tf.control_dependencies([apply_op]), tf.name_scope("gather_updated_shards"):
            gathers = self._gathers(by_name)
        return tf.group(apply_op, *gathers, name="sharded_apply")

    def _pairs_by_name(self, pairs) -> Dict[str, List[tuple]]:
        """{plain name: [tower t's (gradient, copy)]}, in the pairs' order."""
        by_name: Dict[str, List[tuple]] = {}
        for gradient, variable in pairs:
            by_name.setdefault(variable_copies.plain_name(variable.op.name), []).append(
                (gradient, variable))
        for name, copies in by_name.items():
            if len(copies) != self._copies.num_towers:
                raise ValueError(f"Sharded update: {name} has {len(copies)} copies with a "
                                 f"gradient, not {self._copies.num_towers}.")
        return by_name

    def _gathers(self, by_name):
        """Every non-owner copy assigned its owner's updated value, on its own device."""
        assigns = []
        for name, owner in self.owners.items():
            source = by_name[name][owner][1]
            with tf.device(source.device):
                value = source.read_value()
            for tower, (_, copy) in enumerate(by_name[name]):
                if tower != owner:
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

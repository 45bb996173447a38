"""Replicated variables with the optimizer sharded: each tower updates 1/N of them.

    update = towerlib.Replicated(shard_update=True)
    train = towerlib.build_train_graph(model, batch, optimizer, num_towers=4, update=update)

As under Replicated(), every tower holds a copy of every weight. But each weight
has ONE owner tower, and instead of N towers each summing every gradient and
applying the whole update with slots for every weight:

1. reduce-scatter: every tower sends its gradients of the weights tower m owns
   to tower m (packed), which sums them: no tower receives another's sums;
2. only the owner applies the optimizer to its copy, so only the owner holds
   that weight's slots (Adam's m and v);
3. all-gather: the updated value is copied into the other towers' copies,
   after the apply and before anything reads the weights.

What crosses between devices is then what one all-reduce carries: each
weight's gradient N - 1 times to its owner, its new value N - 1 times back.
Both go by the graph's own transfers (device to device), whatever the
`exchange`: a collective all-reduce would hand every tower every sum.

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

Across workers the owners are among every tower of every worker (W x N members),
so each holds 1/(W x N) of the slots. The gradients cross between workers through
the build's exchange as under Replicated() (every local tower can read every sum;
only the owner applies it), and after the apply one more exchange hands every copy
its owner's new value (an all-gather of each owner's weights: the same bits).
Each worker's checkpoint stays whole: every save gathers each slot from its owner,
and a restart refills the owners from the chief's checkpoint
(towerlib.update.slot_shards).
"""

from typing import Dict

import tensorflow as tf

from towerlib.update import allreduce, slot_shards
from towerlib.update import copies as variable_copies
from towerlib.update.base import CombinedGradients
from towerlib.update.replicated import ReplicatedUpdate, warn_missing_gradients

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
        self.owners: Dict[str, int] = {}  # plain name -> owner member, set by combine
        # Across workers the exchange spans more members than this process's towers,
        # and the owners are among all of them: member m is worker m // N's tower m % N.
        self._spans_workers = reducer is not None and reducer.group_size > num_towers
        self._members = reducer.group_size if self._spans_workers else num_towers
        self._first_member = reducer.member(0) if self._spans_workers else 0
        self._updated = []   # (tower 0's variable, owner member) with a sum, in order
        self._exchanged_only = []   # across workers: the sums this worker does not apply
        self.slots_over_workers = ()   # SlotShard per slot, across workers (apply)

    def combine(self, tower_grads_and_vars, riders=None):
        """Each weight's gradients summed on its owner tower, and only there.

        Dense gradients: every tower sends its gradients of the weights tower m
        owns to tower m (one packed buffer per owner and dtype, at most
        `pack_bytes`), which adds the towers' buffers in tower order: a
        reduce-scatter, by the graph's own transfers whatever the exchange.
        Sparse gradients (IndexedSlices) go to their owner the same way, which
        concatenates the towers' rows in tower order, as Replicated() gathers them.
        """
        tower_0 = tower_grads_and_vars[0]
        self.owners = owners_by_bytes({v.op.name: _bytes_of(v) for g, v in tower_0
                                       if g is not None}, self._members)
        self._updated = [(v, self.owners[v.op.name]) for g, v in tower_0 if g is not None]
        if self._spans_workers:
            _check_every_worker_owns(self.owners, self._copies.num_towers,
                                     self._members // self._copies.num_towers)
        # The local tower owning each position (None: a tower of another worker).
        owner_of = [self._local_tower(self.owners.get(v.op.name)) for _, v in tower_0]
        if self._spans_workers or riders is not None:
            return self._owned_of_every_sum(tower_grads_and_vars, owner_of, riders)
        warn_missing_gradients(tower_0)
        gradients = [[g for g, _ in pairs] for pairs in tower_grads_and_vars]
        sums = dict(enumerate(gradients[0]))  # one tower: its own gradients
        if self._reducer is not None:
            allreduce.check_same_gradients(gradients)
            with tf.name_scope("reduce_to_owners"):
                sums = _reduce_to_owners(gradients, owner_of, self._reducer.devices,
                                         self._pack_bytes, self._wire_dtype)
                sums.update(_gather_sparse_on_owners(gradients, owner_of,
                                                     self._reducer.devices))
        per_tower = [[] for _ in tower_grads_and_vars]
        owned = []
        for position, (_, variable) in enumerate(tower_0):
            if sums.get(position) is None:
                continue
            owner = owner_of[position]
            copy = tower_grads_and_vars[owner][position][1]
            per_tower[owner].append((sums[position], copy))
            owned.append((sums[position], variable))
        return CombinedGradients(per_tower, owned=owned)

    def _owned_of_every_sum(self, tower_grads_and_vars, owner_of, riders):
        """Across workers: Replicated()'s exchange (every sum, and the riders, on every
        local tower), of which each tower keeps the pairs it owns."""
        combined = super().combine(tower_grads_and_vars, riders)
        sums = {}   # position -> the owner's summed gradient
        self._exchanged_only = []   # sums no local apply reads: their exchange must run
        for tower, pairs in enumerate(combined.per_copy):
            position_of = {id(variable): position for position, (_, variable)
                           in enumerate(tower_grads_and_vars[tower])}
            for gradient, variable in pairs:
                position = position_of[id(variable)]
                if owner_of[position] == tower:
                    sums[position] = gradient
                else:
                    self._exchanged_only.append(
                        gradient.values if isinstance(gradient, tf.IndexedSlices) else gradient)
        first_sums = {id(variable): gradient for gradient, variable in combined.per_copy[0]}
        per_tower = [[] for _ in tower_grads_and_vars]
        owned = []
        for position, (_, variable) in enumerate(tower_grads_and_vars[0]):
            if position in sums:
                owner = owner_of[position]
                per_tower[owner].append(
                    (sums[position], tower_grads_and_vars[owner][position][1]))
                owned.append((sums[position], variable))
            elif id(variable) in first_sums:   # owned by another worker's tower
                owned.append((first_sums[id(variable)], variable))
        return CombinedGradients(per_tower, riders=combined.riders, owned=owned)

    def _local_tower(self, member):
        """This worker's tower that is group member `member`, or None."""
        if member is None:
            return None
        tower = member - self._first_member
        return tower if 0 <= tower < self._copies.num_towers else None

    def apply(self, optimizer, pairs, global_step):
        """The owners' apply, then every other copy set to its owner's new value."""
        scope = tf.compat.v1.get_variable_scope()
        with tf.compat.v1.variable_scope(scope, custom_getter=self._slot_on_owner,
                                         auxiliary_name_scope=False):
            apply_op = optimizer.apply_gradients(pairs, global_step=global_step)
        with tf.control_dependencies([apply_op]), tf.name_scope("gather_updated_shards"):
            if self._spans_workers:
                gathers = self._gathers_across_workers()
                self.slots_over_workers = slot_shards.describe(
                    optimizer, self._updated, self._copies.num_towers, self._first_member,
                    self._copies.copies_of)
            else:
                gathers = self._gathers([variable for _, variable in pairs])
        # Each tower's half of every exchange runs, the sums it does not apply too: a
        # collective that one member prunes leaves the others waiting.
        return tf.group(apply_op, *gathers, *self._exchanged_only, name="sharded_apply")

    def _gathers_across_workers(self):
        """Every copy of every updated weight set to its owner's new value.

        One all-gather per dtype through the build's exchange: each member's row
        is its owned weights' new values, flattened end to end (and padded to the
        longest row); every tower receives every row, exact, and assigns each
        non-owner copy its slice of the owner's row. Each member sends 1/M of
        the weights and receives them all: half of an all-reduce of the weights.
        Run after the apply (the caller's control dependency).
        """
        by_dtype = {}
        for variable, owner in self._updated:
            by_dtype.setdefault(variable.dtype.base_dtype, []).append((variable, owner))
        ops = []
        for dtype, updated in by_dtype.items():
            layout, width = _row_layout(updated, self._members)
            for tower in range(self._copies.num_towers):
                ops.extend(self._gather_rows(dtype, updated, layout, width, tower))
        return ops

    def _gather_rows(self, dtype, updated, layout, width, tower):
        """Tower `tower`'s half of one dtype's all-gather, and its copies' assigns."""
        member = self._first_member + tower
        copy_of = {variable.op.name: self._copies.copies_of(variable.op.name)[tower]
                   for variable, _ in updated}
        with tf.device(self._reducer.devices[tower]):
            mine = [tf.reshape(copy_of[v.op.name].read_value(), [-1])
                    for v, owner in updated if owner == member]
            filled = sum(v.shape.num_elements() for v, owner in updated if owner == member)
            row = tf.concat(mine + [tf.zeros([width - filled], dtype)], axis=0)
        rows = self._reducer.gather(row, tower_index=tower, name=f"updated_{dtype.name}")
        ops = []
        for variable, owner in updated:
            if owner == member:
                continue
            copy = copy_of[variable.op.name]
            start, size = layout[variable.op.name]
            with tf.device(copy.device):
                value = tf.reshape(rows[owner, start:start + size], copy.shape)
                ops.append(copy.assign(value, read_value=False))
        if not ops:   # this tower owns every weight of the dtype: its half still runs
            ops.append(rows.op)
        return ops

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


def _row_layout(updated, members):
    """({name: (offset in its owner's row, elements)}, the longest row's length).

    Each member's row holds its owned weights flattened, in `updated`'s order.
    """
    layout, filled = {}, [0] * members
    for variable, owner in updated:
        size = variable.shape.num_elements()
        layout[variable.op.name] = (filled[owner], size)
        filled[owner] += size
    return layout, max(filled)


def _check_every_worker_owns(owners, num_towers, num_workers):
    """Refuses a build in which some worker would own no variable (no apply there)."""
    owning = {member // num_towers for member in owners.values()}
    if len(owning) < num_workers:
        raise ValueError(
            f"Replicated(shard_update=True) shards the optimizer over {num_workers} "
            f"workers x {num_towers} towers, and the model trains {len(owners)} "
            "variables: some worker would own none. Fix: train on fewer workers or "
            "towers, or use Replicated() for this model.")


def _gather_sparse_on_owners(gradients, owner_of, devices):
    """{position: IndexedSlices of every tower's rows, in tower order, on its owner}."""
    gathered = {}
    for position, first in enumerate(gradients[0]):
        if not isinstance(first, tf.IndexedSlices):
            continue
        towers = [tower[position] for tower in gradients]
        with tf.device(devices[owner_of[position]]):
            gathered[position] = tf.IndexedSlices(
                values=tf.concat([g.values for g in towers], axis=0),
                indices=tf.concat([g.indices for g in towers], axis=0),
                dense_shape=first.dense_shape)
    return gathered


def _reduce_to_owners(gradients, owner_of, devices, pack_bytes, wire_dtype):
    """{position: the sum over towers of dense gradient `position`, on its owner}.

    Args:
      gradients: per tower, its gradients (Tensor, IndexedSlices or None) in
        tower 0's variable order.
      owner_of: per position, the owner tower.
      devices: per tower, its device.
      pack_bytes: the largest buffer a tower sends an owner (0: one per gradient).
      wire_dtype: None, or the half type the buffers cross and add in.

    The owner adds the towers' buffers with one AddN in tower order, the op and the
    order of the graph transport's hub: the same bits as Replicated()'s sum there.
    """
    dense = [p for p, g in enumerate(gradients[0])
             if g is not None and not isinstance(g, tf.IndexedSlices)]
    sums = {}
    for owner, device in enumerate(devices):
        # The last gradients first, as backprop computes them (Replicated's order).
        mine = [p for p in reversed(dense) if owner_of[p] == owner]
        # Buffers sized as they cross: in the wire dtype (as Replicated() sizes them).
        sent_as = [tf.TensorSpec(gradients[0][p].shape, wire_dtype or gradients[0][p].dtype)
                   for p in mine]
        for group in allreduce.pack_groups(sent_as, pack_bytes):
            positions = [mine[i] for i in group]
            sent = [_buffer([gradients[t][p] for p in positions], devices[t], wire_dtype)
                    for t in range(len(devices))]
            with tf.device(device):
                total = tf.add_n(sent, name=f"sum_on_tower_{owner}")
                pieces = tf.split(total, [gradients[0][p].shape.num_elements()
                                          for p in positions])
                for p, piece in zip(positions, pieces):
                    original = gradients[0][p]
                    sums[p] = tf.cast(tf.reshape(piece, original.shape), original.dtype)
    return sums


def _buffer(tensors, device, wire_dtype):
    """The tensors flattened into one vector (in `wire_dtype`), on their tower's device."""
    with tf.device(device):
        flat = [tf.reshape(tf.convert_to_tensor(t), [-1]) for t in tensors]
        if wire_dtype is not None:
            flat = [tf.cast(t, wire_dtype) for t in flat]
        return flat[0] if len(flat) == 1 else tf.concat(flat, axis=0)


def _bytes_of(variable):
    shape = variable.shape
    count = shape.num_elements() if shape.is_fully_defined() else 0
    return count * variable.dtype.base_dtype.size

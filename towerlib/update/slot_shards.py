"""Optimizer slots sharded over workers: what each saves, and how a restart refills them.

With Replicated(shard_update=True) across W workers x N towers, each of the W x N
towers owns 1/(W x N) of the weights and alone holds their slots (Adam's m and v),
under the plain names an unsharded run saves ('w/Adam'). A worker therefore holds
only its towers' slots, yet every worker's checkpoint must stay whole: an elastic
restart onto another number of workers reads any slot from the chief's.

- Saving: each slot is saved through a TensorSaveable whose value is gathered from
  its owner (an all-reduce of the owner's value and every other member's -0.0),
  so every worker's Saver writes every slot, as PyTorch's ZeroRedundancyOptimizer
  consolidates its state before a save. The whole slot state is in this process
  only while the save runs, and every worker must save at the same steps (they
  do: across workers checkpoints are saved every save_checkpoint_steps).
- Restoring: a worker's Saver restores the slots it owns and reads past the rest.
- Restarting: `fill_op` sets every owner's slots to the chief's checkpoint (read
  by the chief, sent in buffers of at most `chunk_bytes`, one after another), for
  the workers that restored nothing or own other slots than before.

    shards = describe(optimizer, updated, num_towers, first_member, copies_of)
    saved = saveables(reducer, shards, chunk_bytes)    # after the step's calls
    finite = finite_everywhere(reducer, shards)        # run before every save
    fill, prefix = fill_op(reducer, shards, chunk_bytes)   # run(fill, {prefix: p})
    install_whole_saver(graph)                         # the run's Saver saves `saved`
"""

import dataclasses
import threading
import weakref
from typing import Optional, Tuple

import tensorflow as tf

from towerlib.internals import function_graphs
from towerlib.internals import saveables as saveables_lib
from towerlib.update import allreduce

__all__ = ["SlotShard", "check_holds_every_slot", "describe", "fill_op", "fill_of",
           "finite_everywhere", "finite_of", "install_whole_saver", "saveables",
           "saveables_of", "saves_whole", "shards_of", "sharded_names"]

# Per graph, held weakly (as towerlib.exchange.keys holds its allocators): graph
# collections would do, but every Saver.save with a meta graph would warn that it
# cannot serialize these objects.
_STATES = weakref.WeakKeyDictionary()
_STATES_LOCK = threading.Lock()


@dataclasses.dataclass
class _GraphState:
    """What one graph's build made: its SlotShards, their saveables, (fill, prefix)."""

    shards: tuple = ()
    saveables: list = dataclasses.field(default_factory=list)
    fill: Optional[tuple] = None
    finite: Optional[tf.Tensor] = None
    whole_saver: bool = False


def _state(graph):
    """`graph`'s state; a function body's (float16's skip) is its outer graph's."""
    graph = function_graphs.root_graph(graph)
    with _STATES_LOCK:
        return _STATES.setdefault(graph, _GraphState())


@dataclasses.dataclass(frozen=True)
class SlotShard:
    """One slot of one weight, as every worker sees it.

    Attributes:
      name: its name in a checkpoint ('w/Adam'), the same on every worker.
      shape, dtype: its shape and dtype (the weight's).
      owner: the group member holding it (member m: worker m // N, tower m % N).
      variable: the slot variable on this worker, or None (another worker owns it).
    """

    name: str
    shape: tf.TensorShape
    dtype: tf.DType
    owner: int
    variable: Optional[tf.Variable]


def describe(optimizer, updated, num_towers, first_member, copies_of) -> Tuple[SlotShard]:
    """Every slot of every updated weight, this worker's owned ones with their variable.

    Args:
      optimizer: the tf.compat.v1 optimizer, after its apply built the slots.
      updated: (tower 0's variable, owner member) per weight with a gradient.
      num_towers, first_member: this worker's towers and its tower 0's member.
      copies_of: plain name -> every local tower's copy.

    A weight owned elsewhere has no slot here: its slots' names, shapes and dtypes
    follow those of the weights this worker owns ('<weight>/Adam', '<weight>/Adam_1',
    shaped like the weight), which holds for every optimizer whose slots are one
    per weight and shaped like it (tf.compat.v1's, LARS, LAMB); others are refused.
    """
    template, example = None, None
    local = {}
    for variable, owner in updated:
        tower = owner - first_member
        if not 0 <= tower < num_towers:
            continue
        copy = copies_of(variable.op.name)[tower]
        slots = [optimizer.get_slot(copy, n) for n in optimizer.get_slot_names()]
        found = _slot_suffixes(variable, [s for s in slots if s is not None])
        if template is None:
            template, example = [suffix for suffix, _ in found], variable.op.name
        elif [suffix for suffix, _ in found] != template:
            raise ValueError(
                f"Replicated(shard_update=True) across workers needs the same slots for "
                f"every weight; {type(optimizer).__name__} made {template} for {example} "
                f"and {[suffix for suffix, _ in found]} for {variable.op.name}. Fix: "
                "Replicated(shard_update=False) with this optimizer.")
        local.update({f"{variable.op.name}/{suffix}": slot for suffix, slot in found})
    shards = []
    for variable, owner in updated:   # a slot's dtype is its weight's (checked above)
        for suffix in template or ():
            name = f"{variable.op.name}/{suffix}"
            shards.append(SlotShard(name, variable.shape, variable.dtype.base_dtype, owner,
                                    local.get(name)))
    _state(tf.compat.v1.get_default_graph()).shards = tuple(shards)
    return tuple(shards)


def _slot_suffixes(variable, slots):
    """[(suffix, slot)] of a weight's slots, refusing one not named, shaped and typed
    like it (every worker describes the slots it does not hold from its weight)."""
    found = []
    for slot in slots:
        prefix = variable.op.name + "/"
        if not slot.op.name.startswith(prefix) or slot.shape != variable.shape or \
                slot.dtype.base_dtype != variable.dtype.base_dtype:
            raise ValueError(
                f"Replicated(shard_update=True) across workers shards slots named, "
                f"shaped and typed like their weight; {slot.op.name} {slot.shape} "
                f"{slot.dtype.base_dtype.name} is not, for {variable.op.name} "
                f"{variable.shape} {variable.dtype.base_dtype.name}. Fix: "
                "Replicated(shard_update=False) with this optimizer.")
        found.append((slot.op.name[len(prefix):], slot))
    return found


def saveables(reducer, shards, chunk_bytes):
    """Per slot a TensorSaveable: its whole value, gathered from its owner when saved.

    Every local tower takes part in each gather (the owner's tower sends the slot,
    every other member -0.0); the saved tensor is tower 0's result, after every
    local tower's half ran. Restoring assigns the slots this worker owns.
    """
    result = []
    for number, group in enumerate(_groups(shards, chunk_bytes)):
        received = _from_members(reducer, group, lambda shard, tower: _owned_value(
            shard, reducer, tower), f"slots_for_saving_{number}")
        others = [value.op for values in received[1:] for value in values]
        # Saved from host memory: the Saver holds every slot at once, and a GPU tower
        # would then hold the whole state sharding spares it (a buffer at a time here).
        with tf.device(_host_of(reducer)), tf.control_dependencies(others):
            for shard, value in zip(group, received[0]):
                result.append(saveables_lib.TensorSaveable(
                    tf.identity(value), shard.name, _restore_fn(shard)))
    _state(tf.compat.v1.get_default_graph()).saveables = list(result)
    return result


def finite_everywhere(reducer, shards):
    """A bool scalar: every slot of every worker is finite.

    Each local tower counts its owned slots that hold a NaN or Inf; one float32
    all-reduce sums the counts. A save checks it first, on every worker, so a
    slot gone non-finite on one worker stops every worker's save with the same
    error, instead of its owner refusing alone and the others waiting in the
    save's gather until their deadline.
    """
    counts = []
    for tower in range(reducer.num_towers):
        owned = [shard.variable for shard in shards if shard.variable is not None
                 and reducer.member(tower) == shard.owner]
        with tf.device(reducer.devices[tower]):
            bad = [tf.cast(tf.logical_not(tf.reduce_all(tf.math.is_finite(v))), tf.float32)
                   for v in owned]
            count = tf.add_n(bad) if bad else tf.zeros([], tf.float32)
        counts.append(reducer.sum([count], tower_index=tower, differentiable=False,
                                  name="non_finite_slots")[0])
    others = [count.op for count in counts[1:]]
    with tf.device(reducer.devices[0]), tf.control_dependencies(others):
        finite = tf.equal(counts[0], 0.0, name="every_slot_finite")
    _state(tf.compat.v1.get_default_graph()).finite = finite
    return finite


def fill_op(reducer, shards, chunk_bytes):
    """(op, prefix placeholder): every owner's slots set to those in the chief's `prefix`.

    The chief reads each buffer's slots from its checkpoint (RestoreV2); every other
    member sends -0.0; the owner assigns the sum. Buffers go one after another, so
    at most about `chunk_bytes` (or one slot) is in transit. Every worker runs it,
    at the same start, when the chief restored a checkpoint.
    """
    prefix = tf.compat.v1.placeholder_with_default("", [], name="slot_fill_prefix")
    done = []
    for number, group in enumerate(_groups(shards, chunk_bytes)):
        with tf.control_dependencies(done):
            restored = _read_on_chief(reducer, group, prefix)
            received = _from_members(
                reducer, group, lambda shard, tower: restored[shard.name]
                if restored and reducer.member(tower) == 0 else _zeros(shard),
                f"slots_from_chief_{number}")
            done = []
            for tower, values in enumerate(received):
                for shard, value in zip(group, values):
                    if shard.variable is not None and reducer.member(tower) == shard.owner:
                        done.append(shard.variable.assign(value, read_value=False))
                    else:
                        done.append(value.op)
    op = tf.group(*done, name="slots_from_chief")
    _state(tf.compat.v1.get_default_graph()).fill = (op, prefix)
    return op, prefix


def install_whole_saver(graph, scaffold=None):
    """Puts in `graph`'s SAVERS the run's Saver (which a Scaffold then uses): each slot
    sharded over the workers saved whole (its saveable), the slot variables this
    worker holds left out. A Saver of the user's own (in SAVERS, or `scaffold`'s)
    would save this worker's slots only: ValueError, before anything runs."""
    ours = saveables_of(graph)
    with graph.as_default():
        theirs = list(graph.get_collection(tf.compat.v1.GraphKeys.SAVERS))
        if scaffold is not None and scaffold.saver is not None:
            theirs.append(scaffold.saver)
        for saver in theirs:
            held = getattr(saver, "_var_list", None) or []
            if not all(any(s is h for h in held) for s in ours):
                raise ValueError(
                    "A tf.compat.v1.train.Saver of your own is in this graph, and with "
                    "Replicated(shard_update=True) across workers it would save only the "
                    "optimizer slots this worker holds. Fix: build no Saver (towerlib "
                    "saves every slot whole through its own), or Replicated() unsharded.")
        if not theirs:
            sharded = sharded_names(graph)
            var_list = ([v for v in tf.compat.v1.global_variables()
                         if v.op.name not in sharded]
                        + graph.get_collection(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS)
                        + saveables_of(graph))
            saver = tf.compat.v1.train.Saver(var_list=var_list, sharded=True,
                                             allow_empty=True)
            graph.add_to_collection(tf.compat.v1.GraphKeys.SAVERS, saver)
    _state(graph).whole_saver = True


def saves_whole(graph):
    """Whether `graph` has no slots sharded over workers, or a Saver saving them whole."""
    state = _state(graph)
    return not state.saveables or state.whole_saver


def check_holds_every_slot(graph, prefix):
    """Refuses (ValueError) a checkpoint to refill the slots from that lacks some."""
    saved = {name for name, _ in tf.train.list_variables(prefix)}
    missing = sorted(sharded_names(graph) - saved)
    if missing:
        raise ValueError(
            f"The checkpoint {prefix} has no {missing[0]} ({len(missing)} optimizer slots "
            "missing), and Replicated(shard_update=True) across workers refills every "
            "slot from the chief's checkpoint. Fix: resume with the optimizer it was "
            "saved with, or start this run in a new train_dir (warm_start for weights).")


def shards_of(graph):
    """The SlotShards of the slots sharded over workers in `graph` (empty if none)."""
    return _state(graph).shards


def sharded_names(graph):
    """The names of the slots sharded over workers in `graph` (a set; empty if none)."""
    return {shard.name for shard in shards_of(graph)}


def saveables_of(graph):
    """The slots' TensorSaveables in `graph` (what the Saver must save instead of them)."""
    return list(_state(graph).saveables)


def finite_of(graph):
    """`finite_everywhere`'s bool scalar in `graph`, or None."""
    return _state(graph).finite


def fill_of(graph):
    """(fill op, prefix placeholder) of `graph`, or None."""
    return _state(graph).fill


def _groups(shards, chunk_bytes):
    """The shards in buffers of at most `chunk_bytes`, one dtype each, in order."""
    by_dtype = {}
    for shard in shards:
        by_dtype.setdefault(shard.dtype, []).append(shard)
    for group in by_dtype.values():
        specs = [tf.TensorSpec(s.shape, s.dtype) for s in group]
        for indices in allreduce.pack_groups(specs, chunk_bytes):
            yield [group[i] for i in indices]


def _from_members(reducer, group, value_of, name):
    """Per local tower, the sums over the group of `value_of(shard, tower)`."""
    received = []
    for tower in range(reducer.num_towers):
        with tf.device(reducer.devices[tower]):
            sent = [value_of(shard, tower) for shard in group]
        received.append(reducer.sum(sent, tower_index=tower, differentiable=False,
                                    name=name))
    return received


def _owned_value(shard, reducer, tower):
    """The slot's value on its owner tower; what adds nothing on every other one."""
    if shard.variable is not None and reducer.member(tower) == shard.owner:
        return shard.variable.read_value()
    return _zeros(shard)


def _zeros(shard):
    """What a member that does not hold `shard` sends (the sum is the holder's value)."""
    return allreduce.nothing_to_add(shard.shape, shard.dtype)


def _read_on_chief(reducer, group, prefix):
    """{name: the slot read from `prefix`} on the chief's tower 0 host, else {}."""
    if reducer.member(0) != 0:
        return {}
    with tf.device(_host_of(reducer)):
        values = tf.raw_ops.RestoreV2(prefix=prefix, tensor_names=[s.name for s in group],
                                      shape_and_slices=[""] * len(group),
                                      dtypes=[s.dtype for s in group])
        return {s.name: tf.reshape(v, s.shape) for s, v in zip(group, values)}


def _host_of(reducer):
    """The CPU of this worker's tower 0 (its host memory), as a device string."""
    return tf.DeviceSpec.from_string(reducer.devices[0]).replace(
        device_type="CPU", device_index=0).to_string()


def _restore_fn(shard):
    """The saveable's restore: assign the slot where this worker owns it, else nothing."""
    def restore(value):
        if shard.variable is None:
            return tf.no_op()
        with tf.device(shard.variable.device):
            return shard.variable.assign(tf.reshape(value, shard.shape), read_value=False)
    return restore

"""Replicated variables: one copy of every variable per tower, on its device.

With ``update='replicated'`` each tower reads and updates its own
copy of every variable, so no weight crosses between devices in a step; only
the gradients do, summed by an all-reduce (towerlib.update.allreduce).

Names. Tower 0's copies carry the plain names ('conv1/weights'), exactly the
variables a parameter-server build creates, and are the only ones a
checkpoint holds; tower i's copy of 'conv1/weights' is
'replicated/tower_<i>/conv1/weights', a *local* variable (not saved, not in
TRAINABLE_VARIABLES). The optimizer's slots follow their variable: tower 0's
'conv1/weights/Momentum' is global, the other towers' slots are local. So a
replicated checkpoint restores into a parameter-server graph, an evaluation
graph or an export, and a parameter-server checkpoint resumes here.

Keeping the copies equal. Every copy's initializer reads tower 0's variable
(through TensorFlow's guard against uninitialized dependencies), and the
copies are local variables: MonitoredSession (and run_training) initializes
local variables after restoring or initializing the global ones, so after
every start or restore the copies hold tower 0's values. In a plain Session,
run ``tf.compat.v1.local_variables_initializer()`` after initializing the
global variables (not in the same session.run: the slots' copies read tower
0's slots), and ``TrainGraph.sync_copies_op`` after any restore (a Saver
restores tower 0's copies only; the others would train on from their old
values). Each step, every copy receives the same
all-reduced gradient and applies the same update with its own slots, so the
copies stay bit-identical (tests check it).
"""

import collections
import re
from typing import Dict, List

import tensorflow as tf

__all__ = ["COPY_PREFIX", "VariableCopies", "copy_name", "plain_name"]

COPY_PREFIX = "replicated"
# Anywhere in a name: a slot created under an enclosing variable scope 'model'
# is 'model/replicated/tower_1/model/conv1/weights/Momentum'.
_COPY_PART = re.compile(rf"(^|/){COPY_PREFIX}/tower_\d+/")


def copy_name(name: str, tower_index: int) -> str:
    """The variable name of tower `tower_index`'s copy of variable `name`."""
    return name if tower_index == 0 else f"{COPY_PREFIX}/tower_{tower_index}/{name}"


def plain_name(name: str) -> str:
    """`name` with any tower-copy part removed: the name tower 0's copy has."""
    return _COPY_PART.sub(r"\1", name)


def _read_of(original):
    """An initializer (get_variable's callable form) that reads `original`."""

    def initializer(shape, dtype=None, partition_info=None):
        del shape, dtype, partition_info
        # The read runs where tower 0's copy lives, not colocated with the new copy.
        with original.graph.colocate_with(original.op, ignore_existing=True):
            value = original.read_value()
        return tf.identity(value)

    return initializer


class VariableCopies:
    """The per-tower copies of one build's variables.

    Use ``getter_for(tower_index)`` as the custom getter of tower
    `tower_index`'s variable scope while the towers are built, and
    ``slot_getter`` as the custom getter around ``apply_gradients``.

    Example: after building 2 towers with a dense layer 'fc',
    ``copies_of('fc/kernel')`` is [fc/kernel, replicated/tower_1/fc/kernel],
    and after a Momentum apply, ``copies_of('fc/kernel/Momentum')`` is
    [fc/kernel/Momentum, replicated/tower_1/fc/kernel/Momentum].
    """

    def __init__(self, num_towers: int):
        self.num_towers = num_towers
        # plain name -> [copy in tower 0, copy in tower 1, ...]
        self._copies: Dict[str, List[tf.Variable]] = collections.OrderedDict()

    def getter_for(self, tower_index: int):
        """The custom getter of tower `tower_index`'s variable scope."""

        def tower_getter(getter, name, *args, **kwargs):
            if tower_index == 0:
                variable = getter(name, *args, **kwargs)
                self._add(name, 0, variable)
                return variable
            original = getter(name, *args, **kwargs)  # reuse: tower 0's
            known = self._copies.get(name)
            if known is None or known[0] is not original:
                raise ValueError(
                    f"Tower {tower_index} reads variable {original.name}, which "
                    "tower 0 did not create in this build, so it has no per-tower "
                    "copies. With update='replicated' every variable the "
                    "towers use must be created by the tower function (tower 0); "
                    "create it there, or use update='parameter_server'.")
            if len(known) > tower_index:
                return known[tower_index]
            copy = self._new_copy(getter, name, tower_index, original,
                                  trainable_hint=kwargs.get("trainable"))
            self._add(name, tower_index, copy)
            return copy

        return tower_getter

    def slot_getter(self, getter, name, *args, **kwargs):
        """Custom getter for the optimizer's slots of the copies.

        The optimizer asks for a slot as '<its variable's name>/<slot>/'
        (under the enclosing variable scope). For a copy's slot (tower i's
        'replicated/tower_i/w/Momentum'), the slot is made a local variable
        initialized from tower 0's ('w/Momentum'), found by the same name
        with the copy's name replaced by tower 0's; the optimizer creates it
        first because tower 0's variables come first in the apply. Other
        variables pass through unchanged.
        """
        requested = name.rstrip("/")
        primary = self._copy_in(requested)
        if primary is None:
            variable = getter(name, *args, **kwargs)
            if self._is_slot_of_tower_0(variable.op.name):
                self._add(variable.op.name, 0, variable)
            return variable
        tower_index, copy, original_primary = primary
        original_name = requested.replace(copy.op.name, original_primary.op.name, 1)
        original = self._global_by_name(original_name)
        # The requested name as it is: its trailing '/' reuses the slot's name scope.
        slot = getter(name, shape=original.shape, dtype=original.dtype.base_dtype,
                      initializer=_read_of(original), trainable=False,
                      collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES],
                      reuse=tf.compat.v1.AUTO_REUSE)
        self._add(original.op.name, tower_index, slot)
        return slot

    def _copy_in(self, slot_name):
        """(tower, copy, tower 0's variable) of the copy whose slot `slot_name` is."""
        best = None
        for copies in self._copies.values():
            for tower_index, copy in enumerate(copies[1:], start=1):
                if (f"{copy.op.name}/" in f"{slot_name}/"
                        and (best is None or len(copy.op.name) > len(best[1].op.name))):
                    best = (tower_index, copy, copies[0])
        return best

    def _is_slot_of_tower_0(self, name):
        return any(f"{copies[0].op.name}/" in name for copies in self._copies.values())

    def sync_op(self):
        """One op assigning tower 0's value to every other copy (weights, slots...).

        For a plain Session that restored tower 0's variables after
        initializing the local ones (run_training and MonitoredSession need
        none: they initialize the copies after restoring).
        """
        assigns = []
        for copies in self._copies.values():
            for copy in copies[1:]:
                with tf.device(copy.device):
                    assigns.append(copy.assign(copies[0].read_value()))
        return tf.group(*assigns, name="copy_tower_0_to_every_tower")

    def copies_of(self, name: str) -> List[tf.Variable]:
        """Every tower's copy of the variable `name` (tower 0's name), in tower order."""
        return list(self._copies[name])

    @property
    def names(self) -> List[str]:
        return list(self._copies)

    def tower_variables(self, variables, tower_index):
        """Tower `tower_index`'s copies of `variables` (tower 0's), in that order."""
        return [self._copy_for(v, tower_index) for v in variables]

    def check_every_variable_has_copies(self, variables) -> None:
        """Refuses variables to train that the towers did not copy."""
        for variable in variables:
            self._copy_for(variable, self.num_towers - 1)

    def _copy_for(self, variable, tower_index):
        name = variable.op.name
        known = self._copies.get(name)
        if known is None or known[0] is not variable or len(known) <= tower_index:
            raise ValueError(
                f"Variable {variable.name} is trained but has no copy in tower "
                f"{tower_index}: it was created outside the towers (before "
                "build_train_graph, say) or only read by some towers. With "
                "update='replicated' every trained variable must be "
                "created by the tower function; or train it with "
                "update='parameter_server'.")
        return known[tower_index]

    def _add(self, name, tower_index, variable):
        known = self._copies.setdefault(name, [])
        if len(known) == tower_index:
            known.append(variable)

    def _new_copy(self, getter, name, tower_index, original, trainable_hint):
        del trainable_hint  # copies never join TRAINABLE_VARIABLES (see module doc)
        return getter(
            copy_name(name, tower_index), shape=original.shape,
            dtype=original.dtype.base_dtype, initializer=_read_of(original),
            trainable=False, collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES],
            reuse=tf.compat.v1.AUTO_REUSE)

    @staticmethod
    def _global_by_name(name):
        for variable in tf.compat.v1.global_variables():
            if variable.op.name == name:
                return variable
        raise ValueError(f"No global variable {name} to copy a slot from; the "
                         "optimizer must create tower 0's slots first.")

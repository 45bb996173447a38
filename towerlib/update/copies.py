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

Keeping the copies equal. Every copy's initializer assigns it tower 0's
value (one read of tower 0's variable serves all its copies; running the
initializers again is ``sync_op``), and the copies are local variables:
MonitoredSession (and run_training) initializes
local variables after restoring or initializing the global ones, so after
every start or restore the copies hold tower 0's values. In a plain Session,
run ``tf.compat.v1.local_variables_initializer()`` after initializing the
global variables (not in the same session.run: the slots' copies read tower
0's slots), and ``TrainGraph.sync_copies_op`` after any restore (a Saver
restores tower 0's copies only; the others would train on from their old
values). Each step, every copy receives the same
all-reduced gradient and applies the same update with its own slots, so the
copies stay bit-identical (tests check it).

Build cost. A copy is its variable's own ops and nothing more: the handle,
the is-initialized check, the initializer's assign and TensorFlow's read
(tests/update/test_build_cost.py). Finding the copy a slot belongs to is a
dictionary lookup per part of the slot's name, not a pass over the copies:
ResNet-50 on 8 towers has 3,000 copies and 1,300 slots.
"""

import collections
import re
from typing import Dict, List, Tuple

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


def _read_for_copies(original):
    """A read of `original`, on its device, that every copy of it is initialized from.

    The read TensorFlow made when it created the variable
    ('conv1/weights/Read/ReadVariableOp', on the variable's device, without
    control inputs) when it is there; else one made here, once per variable
    (VariableCopies caches it). Either way the copies of 8 towers add no read
    of their own, and their initializers are plain assigns of tower 0's value
    that `sync_op` can run again.
    """
    graph = original.graph
    try:
        read = graph.get_tensor_by_name(f"{original.op.name}/Read/ReadVariableOp:0")
    except (KeyError, ValueError):
        read = None
    handle = getattr(original, "handle", None)
    if (read is not None and handle is not None and read.op.type == "ReadVariableOp"
            and read.op.inputs[0].name == handle.name and not read.op.control_inputs
            and read.dtype == original.dtype.base_dtype):
        return read
    # None of the copy's context (its name scope, control dependencies,
    # colocation): the read runs where tower 0's variable lives.
    with graph.name_scope(original.op.name + "/"), tf.control_dependencies(None), \
            graph.colocate_with(original.op, ignore_existing=True):
        if handle is None:  # a reference variable
            return tf.identity(original.read_value(), name="read_for_copies")
        return tf.raw_ops.ReadVariableOp(resource=handle, dtype=original.dtype.base_dtype,
                                         name="read_for_copies")


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
        # A copy's name -> (its tower, the copy, tower 0's variable): finds the
        # copy a slot belongs to without a pass over every copy.
        self._copy_index: Dict[str, Tuple[int, tf.Variable, tf.Variable]] = {}
        # Tower 0's variable's name -> the one read its copies are initialized from.
        self._reads: Dict[str, tf.Tensor] = {}
        # The graph's global variables by name (refreshed when a name is missing).
        self._globals: Dict[str, tf.Variable] = {}

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
                      initializer=self._read_of(original), trainable=False,
                      collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES],
                      reuse=tf.compat.v1.AUTO_REUSE)
        self._add(original.op.name, tower_index, slot)
        return slot

    def _copy_in(self, slot_name):
        """(tower, copy, tower 0's variable) of the copy whose slot `slot_name` is.

        The longest copy name that `slot_name` holds as whole '/'-separated
        parts: 'model/replicated/tower_1/model/w/Momentum' is the slot of
        'replicated/tower_1/model/w'. Looked up part by part (a name has a
        handful of parts, a build thousands of copies).
        """
        parts = slot_name.split("/")
        best = None
        for start in range(len(parts)):
            for end in range(len(parts), start, -1):
                if best is not None and len(best[1].op.name) >= len(
                        "/".join(parts[start:end])):
                    break
                found = self._copy_index.get("/".join(parts[start:end]))
                if found is not None:
                    best = found
                    break
        return best

    def _is_slot_of_tower_0(self, name):
        """Whether `name` is '<...>/<a variable of tower 0>/<...>' (whole parts)."""
        parts = name.split("/")
        return any("/".join(parts[start:end]) in self._copies
                   for start in range(len(parts)) for end in range(start + 1, len(parts)))

    def sync_op(self):
        """One op assigning tower 0's value to every other copy (weights, slots...).

        For a plain Session that restored tower 0's variables after
        initializing the local ones (run_training and MonitoredSession need
        none: they initialize the copies after restoring).
        """
        assigns = []
        for copies in self._copies.values():
            read = self._reads.get(copies[0].op.name)
            for copy in copies[1:]:
                if read is not None and copy.initializer.inputs[1].name == read.name:
                    # Its initializer assigns tower 0's value (_read_for_copies):
                    # running it again is the sync, with no op added per copy.
                    assigns.append(copy.initializer)
                    continue
                with tf.device(copy.device):
                    assigns.append(copy.assign(copies[0].read_value(), read_value=False))
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
                "update='parameter_server'. A tf_keras model object called in your "
                "tower function: call it as towerlib.KerasTower(model, None)."
                "outputs(features, ctx), which gives each tower its copy.")
        return known[tower_index]

    def _add(self, name, tower_index, variable):
        known = self._copies.setdefault(name, [])
        if len(known) == tower_index:
            known.append(variable)
            if tower_index > 0:
                self._copy_index.setdefault(variable.op.name, (tower_index, variable, known[0]))

    def _read_of(self, original):
        """An initializer (get_variable's callable form) giving `original`'s value.

        Every copy of `original` is initialized from the same read of it.
        """

        def initializer(shape, dtype=None, partition_info=None):
            del shape, dtype, partition_info
            read = self._reads.get(original.op.name)
            if read is None:
                read = _read_for_copies(original)
                self._reads[original.op.name] = read
            return read

        return initializer

    def _new_copy(self, getter, name, tower_index, original, trainable_hint):
        del trainable_hint  # copies never join TRAINABLE_VARIABLES (see module doc)
        return getter(
            copy_name(name, tower_index), shape=original.shape,
            dtype=original.dtype.base_dtype, initializer=self._read_of(original),
            trainable=False, collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES],
            reuse=tf.compat.v1.AUTO_REUSE)

    def _global_by_name(self, name):
        variable = self._globals.get(name)
        if variable is None:
            self._globals = {v.op.name: v for v in tf.compat.v1.global_variables()}
            variable = self._globals.get(name)
        if variable is not None:
            return variable
        raise ValueError(f"No global variable {name} to copy a slot from; the "
                         "optimizer must create tower 0's slots first.")

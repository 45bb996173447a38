"""Finding batch norm that is not towerlib's in the towers of a build.

towerlib pools ('all_towers') or synchronizes ('sync') only its own batch
norm: a layer it does not know about (`tf.compat.v1.layers.batch_normalization`,
a hand-written `tf.nn.fused_batch_norm` or `tf.nn.moments` with assign ops in
UPDATE_OPS) normalizes each tower with its own shard's statistics, and its
moving-average update is built once per tower. Under 'all_towers' or 'sync'
the builder runs every tower's update ops, so such a layer gets N unordered
read-modify-write updates a step, one per shard, racing on the same
variables: not the pooled statistics 'all_towers' promises, nor the global
statistics 'sync' promises, and a result that depends on the tower count and
on the order the updates happened to run in.

`check_towers` looks at the ops each tower built (the ops in its name scope,
and the bodies of the functions its `tf.cond`s call) for:

- a FusedBatchNorm / V2 / V3 op in training mode (`is_training=True`);
- a write (Assign*, AssignSub*, AssignAdd*, resource or ref) to a variable
  named like batch norm's moving statistics (`moving_mean`,
  `moving_variance`, `moving_var`), directly or inside a called function
  that receives the variable;
- a write whose value is computed, through elementwise arithmetic only, from
  a batch mean: a Mean op that reduces axis 0 of an input of rank >= 2 and
  keeps some axis (the per-channel statistics of `tf.nn.moments`), the
  pattern of hand-written batch norm kept by ExponentialMovingAverage.

towerlib's own batch norm builds none of these in a tower: inside a builder
it reports its statistics through the build's TowerRecords and the builder
emits the updates outside the towers. A user's other update ops (a counter,
an EMA of the loss) match none of them and keep the documented behaviour.
"""

import dataclasses
from typing import List, Tuple

import tensorflow as tf

from towerlib.update import copies as variable_copies

_FUSED_BATCH_NORM = ("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3")
_WRITES = ("Assign", "AssignSub", "AssignAdd", "AssignVariableOp",
           "AssignSubVariableOp", "AssignAddVariableOp")
_MOVING_NAMES = ("moving_mean", "moving_variance", "moving_var")
_VARIABLES = ("VarHandleOp", "VariableV2", "Variable")
_FUNCTION_CALLS = ("If", "StatelessIf", "While", "StatelessWhile",
                   "PartitionedCall", "StatefulPartitionedCall", "Case", "StatelessCase")
# Ops a moving-average update passes a statistic through on its way to the write.
_ELEMENTWISE = ("Identity", "Squeeze", "Reshape", "Cast", "Sub", "Mul", "AddV2",
                "Add", "RealDiv", "Maximum", "Minimum", "StopGradient")


class ForeignBatchNormError(ValueError):
    """Batch norm that bn_mode cannot pool or synchronize was built in the towers."""


@dataclasses.dataclass
class ForeignBatchNorm:
    """One batch-norm layer towerlib does not manage.

    Attributes:
      layer: the layer's scope name without the tower prefix, e.g. 'bn1'.
      towers: the indices of the towers it was found in.
      evidence: what was seen, e.g. 'FusedBatchNormV3 in training mode'.
    """

    layer: str
    towers: List[int]
    evidence: List[str]

    def describe(self):
        towers = ", ".join(str(t) for t in self.towers)
        return f"'{self.layer}' ({'; '.join(self.evidence)}; towers {towers})"


def find_foreign_batch_norm(towers) -> List[ForeignBatchNorm]:
    """The batch-norm layers in `towers` (towerlib.Tower list) not built by towerlib.

    Returns them in the order first seen, each once with every tower it is in.
    """
    if not towers:
        return []
    graph = _graph_of(towers)
    functions = _FunctionLibrary(graph)
    found = {}  # layer -> ForeignBatchNorm
    prefixes = [(tower.context.name_scope, tower.context.index) for tower in towers]
    for op in graph.get_operations():
        for prefix, index in prefixes:
            if prefix and op.name.startswith(prefix):
                for layer, evidence in _evidence(op, prefix, functions):
                    # A replicated tower's copy is the same layer: list it once.
                    layer = variable_copies.plain_name(layer)
                    entry = found.setdefault(layer, ForeignBatchNorm(layer, [], []))
                    if index not in entry.towers:
                        entry.towers.append(index)
                    if evidence not in entry.evidence:
                        entry.evidence.append(evidence)
                break
    return list(found.values())


def check_towers(towers, bn_mode):
    """Raises ForeignBatchNormError when 'all_towers' or 'sync' meets foreign batch norm.

    Nothing to check with one tower (every mode is exact there) or with
    'first_tower', which is what such a layer does anyway: each tower
    normalizes with its own shard and tower 0's update ops run.
    """
    promise = bn_mode.promise
    if promise is None or len(towers) < 2:
        return
    layers = find_foreign_batch_norm(towers)
    if not layers:
        return
    listing = "\n  ".join(layer.describe() for layer in layers)
    raise ForeignBatchNormError(
        f"bn_mode='{bn_mode}' {promise}, but these batch-norm layers are not "
        f"towerlib's, so it cannot do that for them:\n  {listing}\n"
        f"Built as they are on {len(towers)} towers they would normalize each "
        "tower with its own shard's statistics and run every tower's "
        "moving-average update, unordered, on the same variables (N updates a "
        "step from N shards: the result depends on the tower count and on the "
        "order they happen to run in).\nFix: use towerlib's batch norm in the "
        "tower function: `tfl = towerlib.layers.for_tower(ctx)` then "
        "`tfl.batch_normalization(...)` takes the arguments of "
        "tf.compat.v1.layers.batch_normalization and creates the same variables "
        "(checkpoints restore), or towerlib.batch_norm(x, ctx, name=...). Or "
        "build with bn_mode='first_tower', which is what these layers do: each "
        "tower normalizes with its own shard, and only tower 0's update ops run.")


def _graph_of(towers):
    for tower in towers:
        if tower.loss is not None:
            return tower.loss.graph
    return tf.compat.v1.get_default_graph()


def _layer_of(name, prefix=""):
    """'tower_1/block/bn1/FusedBatchNormV3' -> 'block/bn1' (op or variable name)."""
    if prefix and name.startswith(prefix):
        name = name[len(prefix):]
    return name.rsplit("/", 1)[0] if "/" in name else name


def _shared_name(variable_op):
    """The variable's name without a replicated copy's prefix: one per layer, not per tower."""
    return variable_copies.plain_name(variable_op.name)


def _variable_behind(tensor, hops=8):
    """The variable op a resource handle or ref tensor comes from, or None."""
    op = tensor.op
    for _ in range(hops):
        if op.type in _VARIABLES:
            return op
        if op.type != "Identity" or not op.inputs:
            return None
        op = op.inputs[0].op
    return None


def _is_moving_statistic(variable_op):
    return variable_op.name.rsplit("/", 1)[-1] in _MOVING_NAMES


def _is_batch_mean(op):
    """A Mean over axis 0 of a rank >= 2 input that keeps some axis."""
    if op.type != "Mean" or len(op.inputs) < 2:
        return False
    rank = op.inputs[0].shape.rank
    axes = tf.get_static_value(op.inputs[1])  # constant axes only
    if rank is None or rank < 2 or axes is None:
        return False
    axes = {int(a) % rank for a in tf.nest.flatten(axes.tolist())}
    return 0 in axes and len(axes) < rank


def _fed_by_batch_statistics(tensor, hops=12):
    """Whether `tensor` comes from batch statistics through elementwise ops."""
    frontier, seen = [tensor.op], set()
    for _ in range(hops):
        following = []
        for op in frontier:
            if op.name in seen:
                continue
            seen.add(op.name)
            if _is_batch_mean(op) or op.type in _FUSED_BATCH_NORM:
                return True
            if op.type in _ELEMENTWISE:
                following.extend(t.op for t in op.inputs)
        frontier = following
    return False


def _evidence(op, prefix, functions) -> List[Tuple[str, str]]:
    """(layer, what was seen) pairs for one op of a tower."""
    if op.type in _FUSED_BATCH_NORM and op.get_attr("is_training"):
        return [(_layer_of(op.name, prefix), f"{op.type} in training mode")]
    if op.type in _WRITES and len(op.inputs) >= 2:
        variable = _variable_behind(op.inputs[0])
        if variable is not None and op.name == variable.name + "/Assign":
            return []  # the variable's own initializer (a variable made in the tower)
        if variable is not None and _is_moving_statistic(variable):
            return [(_layer_of(variable.name),
                     f"updates {_shared_name(variable)} in the tower")]
        if variable is not None and _fed_by_batch_statistics(op.inputs[1]):
            return [(_layer_of(op.name, prefix),
                     f"{op.name[len(prefix):]} writes {_shared_name(variable)} from batch moments")]
        return []
    if op.type in _FUNCTION_CALLS:
        body = functions.reachable_op_types(op)
        found = []
        if any(t in _FUSED_BATCH_NORM for t, training in body if training):
            found.append((_layer_of(op.name, prefix),
                          "FusedBatchNorm in training mode inside a tf.cond"))
        if any(t in _WRITES for t, _ in body):
            for tensor in op.inputs:
                variable = _variable_behind(tensor)
                if variable is not None and _is_moving_statistic(variable):
                    found.append((_layer_of(variable.name),
                                  f"updates {_shared_name(variable)} inside a tf.cond"))
        return found
    return []


class _FunctionLibrary:
    """The graph's functions (tf.cond branches etc.), read once when first needed."""

    def __init__(self, graph):
        self._graph = graph
        self._definitions = None

    def reachable_op_types(self, call_op):
        """{(op type, is_training attr)} of the functions `call_op` calls, nested."""
        if self._definitions is None:
            self._definitions = {f.signature.name: f
                                 for f in self._graph.as_graph_def().library.function}
        names = [value.func.name for value in call_op.node_def.attr.values()
                 if value.HasField("func")]
        names += [f.name for value in call_op.node_def.attr.values()
                  for f in value.list.func]
        found, seen = set(), set()
        while names:
            name = names.pop()
            if name in seen or name not in self._definitions:
                continue
            seen.add(name)
            for node in self._definitions[name].node_def:
                training = "is_training" in node.attr and node.attr["is_training"].b
                found.add((node.op, training))
                names += [value.func.name for value in node.attr.values()
                          if value.HasField("func")]
                names += [f.name for value in node.attr.values() for f in value.list.func]
        return found

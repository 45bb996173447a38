"""Build-time check that no tower's loss reads another tower's examples.

Data parallelism needs each tower's loss to be computed from its own shard
only. TF 1 code written for one device can break that without any error: the
single-GPU tutorial's `loss()` returns the sum of the whole 'losses'
collection, and in a multi-tower build that collection already holds the
cross entropy of towers 0..i-1 when tower i is built, so tower i's "loss" is
the sum of i + 1 towers' losses (4.68, 9.35, 14.03, 18.71 on 4 towers) and
the gradient counts the first towers' examples again.

The check walks back from each tower's loss through the ops of that tower's
name scope and stops at variables and at every op outside the tower: the
split of the global batch, shared variables, and towerlib's own cross-tower
exchanges (the 'graph' transport's hub ops live outside the towers; the
'collective' transport's ops sit in each tower and only read that tower's
tensors). An op of another tower reached this way is an error when it is
computed from that tower's examples; one computed from variables and
constants alone (e.g. a tensor cached in tower 0 and reused) mixes nothing
and is allowed. Each op is visited at most once per tower's walk, so the
check costs about one pass over the towers' forward graph.

Why an error and not a warning: the gradient of such a graph is silently
wrong (examples counted several times, gradients flowing into another
tower's activations), and a warning in a long training log is easy to miss.
A deliberate cross-tower dependency (not through towerlib.exchange) can opt
out with `check_isolation=False`.
"""

from typing import Dict, List, Optional, Sequence

import tensorflow as tf

from towerlib.checks import graph_walk


class TowerIsolationError(ValueError):
    """A tower's loss depends on ops computed from another tower's examples."""


def _owner(op: tf.Operation, name_scopes: Sequence[str]) -> Optional[int]:
    """The index of the tower whose name scope holds `op`, or None (outside the towers)."""
    for index, scope in enumerate(name_scopes):
        if graph_walk.in_scope(op, scope):
            return index
    return None


def _data_tensor_names(towers) -> frozenset:
    """Names of every tower's input tensors (its shard of the global batch)."""
    return frozenset(t.name for tower in towers for t in tf.nest.flatten(tower.inputs)
                     if isinstance(t, (tf.Tensor, tf.Variable)) and hasattr(t, "name"))


def _reads_examples(op: tf.Operation, name_scope: str, data_names: frozenset) -> bool:
    """Whether `op` (in tower scope `name_scope`) is computed from input examples."""
    def descend(visited):
        return graph_walk.in_scope(visited, name_scope)

    for visited in graph_walk.upstream_ops([op], descend):
        tensors = list(visited.outputs) + (
            list(visited.inputs) if descend(visited) else [])
        if any(t.name in data_names for t in tensors):
            return True
    return False


def _collections_holding(op: tf.Operation) -> List[str]:
    """The names of the graph collections that hold `op` or one of its outputs."""
    graph = op.graph
    found = []
    for key in graph.get_all_collection_keys():
        for item in graph.get_collection(key):
            if item is op or getattr(item, "op", None) is op:
                found.append(str(key))
                break
    return found


def _error(tower_index, loss, other_index, other_op, collections):
    where = (f"It is in the graph collection {', '.join(repr(c) for c in collections)}: "
             if collections else "")
    first = collections[0] if collections else "losses"
    return TowerIsolationError(
        f"Tower {tower_index}'s loss {loss.name} depends on tower {other_index}'s op "
        f"{other_op.name!r} ({other_op.type}), which is computed from tower "
        f"{other_index}'s examples: the towers' batches mix, and the gradient would "
        f"count tower {other_index}'s examples again in tower {tower_index}. "
        f"{where}the likely cause is a collection read without the tower's scope, "
        f"e.g. tf.compat.v1.get_collection({first!r}) in a loss() written for one "
        "device, which returns the entries of every tower built so far. Read the "
        f"tower's own entries: tf.compat.v1.get_collection({first!r}, "
        "ctx.name_scope) (the tutorial's tower_loss(scope) does this). Exchanges "
        "between towers belong in towerlib.exchange.CrossTowerReducer; pass "
        "check_isolation=False only if this dependency is intended.")


def check_tower_isolation(towers) -> None:
    """Raises TowerIsolationError if a tower's loss reads another tower's examples.

    Args:
      towers: the `towerlib.Tower`s of one build, in tower order; towers
        without a loss are skipped.
    """
    name_scopes = [tower.context.name_scope for tower in towers]
    if len(towers) < 2 or not all(name_scopes):
        return
    data_names = _data_tensor_names(towers)
    reads_examples: Dict[str, bool] = {}
    for index, tower in enumerate(towers):
        if tower.loss is None:
            continue
        crossings = []

        def descend(op, index=index, crossings=crossings):
            owner = _owner(op, name_scopes)
            if owner is not None and owner != index:
                crossings.append((owner, op))
            return owner == index

        for _ in graph_walk.upstream_ops([tower.loss.op], descend):
            pass
        for owner, op in crossings:
            if op.name not in reads_examples:
                reads_examples[op.name] = _reads_examples(
                    op, name_scopes[owner], data_names)
            if reads_examples[op.name]:
                raise _error(index, tower.loss, owner, op, _collections_holding(op))

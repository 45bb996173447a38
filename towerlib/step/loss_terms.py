"""Taking the regularization out of a tower's loss, so that `loss` is the data loss.

towerlib's objective is `sum_i (n_i / B) * loss_i + regularization`, where
loss_i must be tower i's data loss and the regularization counts once. It
takes the regularization from two places:

1. `GraphKeys.REGULARIZATION_LOSSES` (towerlib layers' `weight_decay=`, a
   `regularizer=` of `get_variable`): train_graph adds these terms itself, a
   weight's once, a tower's own (activity) term weighted by its share.
2. The TF 1 tutorial's convention (`cifar10.py`): weight decay is put into
   the 'losses' collection (`GraphKeys.LOSSES`) next to the cross entropy,
   and the tower returns `tf.add_n(tf.compat.v1.get_collection('losses',
   scope))`. That sum is recognized here.

Recognition is structural, not by name: the tower's loss is taken apart
through Identity, Add, AddV2 and AddN ops into its summands. A summand that
is a REGULARIZATION_LOSSES term towerlib already counts (or a new evaluation
of one: reading no example and the same variables) is dropped from the data
loss, else it would count twice. A summand that is in the 'losses'
collection and is computed from no tower's examples (a walk back from it
reaches only variables and constants) is weight regularization: it counts
once, from tower 0 (the tutorial creates the same weight decay in every
tower, or, written with the variables, in tower 0 only; a later tower's
copies must read the same variables as tower 0's and are dropped). Every
other summand stays in the data loss. A loss with no such summand is left
exactly as the tower returned it.

Why automatic rather than an explicit declaration: the 'losses' collection
already is the declaration in TF 1 code, the rule only moves terms the user
registered as losses and that cannot be a data loss (they read no example),
and the gradient is unchanged either way: what changes is that `loss` and
`regularization_loss` report what they say, with code brought as it is.
A weight penalty that is not a bare summand in one of the collections (e.g.
`ce + 0.5 * wd`) stays in the data loss.
"""

import dataclasses
from typing import Iterable, List, Sequence, Tuple

import tensorflow as tf

from towerlib.checks import graph_walk
from towerlib.update import copies as variable_copies

_SUM_OP_TYPES = frozenset({"Add", "AddV2", "AddN"})


def summands(loss: tf.Tensor) -> List[tf.Tensor]:
    """The terms `loss` is the sum of, through Identity, Add, AddV2 and AddN ops.

    An Identity with control inputs is a term of its own (its control
    dependencies must stay).
    """
    terms, stack = [], [loss]
    while stack:
        tensor = stack.pop()
        op = tensor.op
        if op.type in _SUM_OP_TYPES or (op.type == "Identity" and not op.control_inputs):
            stack.extend(reversed(list(op.inputs)))
        else:
            terms.append(tensor)
    return terms


def reads_examples(tensor: tf.Tensor, data_tensor_names: frozenset) -> bool:
    """Whether `tensor` is computed from any of the named input tensors."""
    for op in graph_walk.upstream_ops([tensor.op], lambda op: True):
        if any(t.name in data_tensor_names for t in list(op.outputs) + list(op.inputs)):
            return True
    return False


def variables_read(tensor: tf.Tensor) -> Tuple[str, ...]:
    """Sorted names of the variables `tensor` is computed from (its signature)."""
    names = set()
    for op in graph_walk.upstream_ops([tensor.op], lambda op: True):
        if op.type in graph_walk.VARIABLE_OP_TYPES:
            names.add(op.name)
        elif graph_walk.is_variable_read(op):  # the walk stops at the read
            names.add(graph_walk.source_op(op.inputs[0].op).name)
    # A replicated tower reads its own copy of tower 0's variable: the same one.
    return tuple(sorted(variable_copies.plain_name(name) for name in names))


@dataclasses.dataclass
class _TowerTerms:
    data: List[tf.Tensor]
    weight: List[tf.Tensor]
    already_counted: List[tf.Tensor]


def _classify(loss, data_names, counted_names, counted_signatures,
              loss_collection_names):
    terms = _TowerTerms([], [], [])
    loss_summands = summands(loss)
    if len(loss_summands) < 2:  # nothing to take apart (and no walk to pay for)
        terms.data.append(loss)
        return terms
    for term in loss_summands:
        if term.name in counted_names:
            terms.already_counted.append(term)
            continue
        weight_only = not reads_examples(term, data_names)
        if weight_only and term.name in loss_collection_names:
            terms.weight.append(term)
        elif weight_only and variables_read(term) in counted_signatures:
            # A new evaluation of a counted term: a resource variable's
            # regularizer sits in the collection as a lazy tensor, and
            # get_regularization_losses() builds a copy of it at each use.
            terms.already_counted.append(term)
        else:
            terms.data.append(term)
    return terms


def _check_copies_of_tower_0(index, weight_terms, first_tower_terms):
    signatures = sorted(variables_read(t) for t in weight_terms)
    if signatures != sorted(variables_read(t) for t in first_tower_terms):
        raise ValueError(
            f"Tower {index}'s loss adds weight regularization from the 'losses' "
            f"collection ({', '.join(t.name for t in weight_terms)}) that differs "
            "from tower 0's. towerlib counts the weight regularization once, from "
            "tower 0: create the same weight-decay terms in every tower (as the "
            "TF 1 tutorial does) or in tower 0 only.")


def separate_regularization(towers: Sequence, counted_terms: Iterable[tf.Tensor]):
    """Each tower with its data loss, and the collection regularization to count once.

    Args:
      towers: the `towerlib.Tower`s of one build, tower 0 first.
      counted_terms: the REGULARIZATION_LOSSES terms train_graph adds itself.

    Returns:
      (towers, weight_terms): the towers, those whose loss held regularization
      replaced by a copy whose `loss` is the sum of its data summands (a float
      scalar built in the tower's name scope and device); and tower 0's
      weight terms from the 'losses' collection (float scalars), to be added
      once.
    """
    towers = list(towers)
    if not towers:
        return towers, []
    counted_terms = list(counted_terms)
    counted_names = frozenset(t.name for t in counted_terms)
    loss_collection_names = frozenset(
        t.name for t in tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.LOSSES)
        if hasattr(t, "name"))
    if not counted_names and not loss_collection_names:
        return towers, []
    data_names = frozenset(t.name for tower in towers for t in tf.nest.flatten(tower.inputs)
                           if isinstance(t, tf.Tensor))
    counted_signatures = frozenset(
        signature for signature in (variables_read(t) for t in counted_terms
                                    if not reads_examples(t, data_names))
        if signature)
    separated, first_tower_weight_terms = [], []
    for index, tower in enumerate(towers):
        terms = _classify(tower.loss, data_names, counted_names, counted_signatures,
                          loss_collection_names)
        if index == 0 and terms.data:  # a loss of regularization alone stays as it is
            first_tower_weight_terms = terms.weight
        elif terms.weight:
            _check_copies_of_tower_0(index, terms.weight, first_tower_weight_terms)
        if not (terms.weight or terms.already_counted) or not terms.data:
            separated.append(tower)
            continue
        with tf.name_scope(tower.context.name_scope), tf.device(tower.context.device):
            data_loss = tf.add_n(terms.data, name="data_loss")
        separated.append(dataclasses.replace(tower, loss=data_loss))
    return separated, first_tower_weight_terms

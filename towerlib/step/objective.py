"""The objective one optimizer step minimizes, built micro-batch by micro-batch.

For a global batch of B examples over N towers and k micro-batches, where
tower i of micro-batch j sees n_ji examples and returns loss_ji (its mean):

    objective = sum_ji (n_ji / B) * loss_ji          the mean loss over all B
              + sum_ji (n_ji / B) * activity_ji      a tower's own terms, weighted
              + weight_regularization                once, in tower 0 of micro-batch 0

so every tower differentiates only its own term `tower_objective_ji`, and the
sum of the towers' gradients is one device's gradient on the whole batch.

Where the regularization comes from (towerlib.step.loss_terms has the rules):
a weight's REGULARIZATION_LOSSES term is created once, with the weight, in
micro-batch 0 and outside every tower's name scope; an activity term exists
once per tower, inside its name scope; the TF 1 tutorial's weight decay is a
summand of the tower's returned loss taken from the 'losses' collection.

    objective = StepObjective(global_examples=None)   # B from the towers' counts
    for inputs in micro_batches:                      # each: build the towers...
        before = objective.regularization_before()    # ...after this snapshot
        towers = build_towers(tower_fn, inputs, ...)
        towers, terms = objective.add_micro_batch(towers, before)
        # terms[i]: tower i's float32 scalar objective for this micro-batch
    with tf.device(host):
        losses = objective.losses()                   # loss, regularization, total
"""

import dataclasses
from typing import List, Optional

import tensorflow as tf

from towerlib.step import loss_terms

__all__ = ["StepLosses", "StepObjective", "split_regularization", "tower_shares"]


def tower_shares(towers, global_examples=None, sum_over_workers=None) -> List[tf.Tensor]:
    """n_i / B per tower (float32 scalars).

    B is `global_examples` with accumulation (every micro-batch's examples:
    a scalar, or one equal scalar per tower), else the sum of these towers'
    batch sizes, or across workers (`sum_over_workers`, see StepObjective)
    of every worker's towers' batch sizes.
    """
    counts = [tf.cast(t.context.batch_size, tf.float32) for t in towers]
    if global_examples is not None:
        if not isinstance(global_examples, (list, tuple)):
            global_examples = [global_examples] * len(counts)
        return [count / total for count, total in zip(counts, global_examples)]
    with tf.name_scope("tower_shares"):
        if sum_over_workers is not None:
            totals = _worker_totals(sum_over_workers, counts, "tower_examples")
            return [count / total for count, total in zip(counts, totals)]
        total = tf.add_n(counts)
        return [count / total for count in counts]


def _worker_totals(sum_over_workers, counts, name):
    """Per local tower, the sum of `counts` over every worker's towers: exchanged once
    at start when every count is static (the batch sizes cannot change), else each step."""
    static = [tf.get_static_value(count) for count in counts]
    if all(value is not None for value in static):
        return sum_over_workers.fixed([float(value) for value in static], name)
    return sum_over_workers(counts, name)


def split_regularization(terms, towers):
    """(shared terms, per-tower terms) of a micro-batch's new regularization losses.

    A term in tower i's name scope is that tower's own (an activity term,
    weighted by the tower's share so its strength does not grow with the
    tower count); any other term belongs to a weight and counts once.
    """
    tower_terms = [[t for t in terms if t.name.startswith(tower.context.name_scope)]
                   for tower in towers]
    in_towers = {id(t) for own in tower_terms for t in own}
    return [t for t in terms if id(t) not in in_towers], tower_terms


@dataclasses.dataclass(frozen=True)
class StepLosses:
    """The step's reported losses (float32 scalars on the host).

    Attributes:
      loss: the mean data loss over the global batch.
      regularization_loss: every regularization term, once (0 when none).
      total_loss: loss + regularization_loss, what the step minimizes.
    """

    loss: tf.Tensor
    regularization_loss: tf.Tensor
    total_loss: tf.Tensor


class StepObjective:
    """Collects the towers of every micro-batch and their weighted objectives.

    Args:
      global_examples: B as a float32 scalar when there are several
        micro-batches (each micro-batch's shares are then of the whole
        global batch), or None (one micro-batch: B is its towers' total).
      sum_over_workers: across workers, a function (one float32 scalar per
        local tower, name) -> per local tower, the sum over every tower of
        every worker (towerlib.step.across_workers). B is then every
        worker's examples, and the reported losses are the global batch's.
      adds_weight_terms: whether this worker's tower 0 adds the weights'
        regularization to its objective: only the chief does across
        workers, so that it counts once in the all-reduced gradient.
    """

    def __init__(self, global_examples: Optional[tf.Tensor] = None,
                 sum_over_workers=None, adds_weight_terms: bool = True):
        if sum_over_workers is not None and global_examples is not None:
            # This worker's B, contributed once (by tower 0) to the global B.
            local = [global_examples] + [tf.zeros_like(global_examples)] * (
                sum_over_workers.num_towers - 1)
            global_examples = _worker_totals(sum_over_workers, local, "global_examples")
        self._global_examples = global_examples
        self._sum_over_workers = sum_over_workers
        self._adds_weight_terms = adds_weight_terms
        self._weight_terms = None            # counted once, from micro-batch 0
        self._first_terms = []               # micro-batch 0's new collection terms
        self._weighted_activity = []
        self.towers = []                     # every micro-batch's towers, micro-batch major
        self.shares = []                     # n_ji / B, in the same order

    @staticmethod
    def regularization_before():
        """A snapshot of REGULARIZATION_LOSSES, taken before a micro-batch is built."""
        return list(tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.REGULARIZATION_LOSSES))

    def add_micro_batch(self, towers, regularization_before, weight_gate=None):
        """(towers with their data loss, each tower's objective term).

        Args:
          towers: the towers of one micro-batch, tower 0 first.
          regularization_before: regularization_before() taken before they were built.
          weight_gate: None, or a float32 scalar the weights' regularization is
            multiplied by: in an accumulation loop, whose body is built once,
            1 for micro-batch 0 and 0 after, so it counts once per step.

        Returns:
          The towers (a loss holding regularization from the 'losses'
          collection replaced by its data summands) and, per tower, its
          float32 scalar objective, built in its name scope and on its device.
        """
        towers = [_loss_in_float32(tower) for tower in towers]
        for tower in towers:
            if tower.loss.dtype == tf.float64:
                raise TypeError(
                    f"Tower {tower.context.index}'s loss {tower.loss.name} has dtype "
                    "float64; towerlib weighs and sums the towers' losses in float32. "
                    "Fix: return tf.cast(loss, tf.float32) (float64 variables still get "
                    "float64 gradients through the cast).")
        first = self._weight_terms is None
        seen = {id(t) for t in regularization_before}
        new_terms = [t for t in tf.compat.v1.get_collection(
            tf.compat.v1.GraphKeys.REGULARIZATION_LOSSES) if id(t) not in seen]
        shares = tower_shares(towers, self._global_examples, self._sum_over_workers)
        shared_terms, activity_terms = split_regularization(new_terms, towers)
        # Later micro-batches may reevaluate micro-batch 0's weight terms.
        counted = new_terms if first else self._first_terms + new_terms
        towers, collection_terms = loss_terms.separate_regularization(towers, counted)
        if first:
            self._first_terms = new_terms
            self._weight_terms = shared_terms + collection_terms
        objectives = []
        for tower, share, own_terms in zip(towers, shares, activity_terms):
            with tf.name_scope(tower.context.name_scope), tf.device(tower.context.device):
                objective = share * tower.loss
                if own_terms:
                    self._weighted_activity.append(share * tf.add_n(own_terms))
                    objective += self._weighted_activity[-1]
                if (first and tower.context.is_first and self._weight_terms
                        and self._adds_weight_terms):
                    weight_terms = tf.add_n(self._weight_terms, name="regularization")
                    if weight_gate is not None:
                        weight_terms *= weight_gate
                    objective += weight_terms
                objectives.append(objective)
        self.towers.extend(towers)
        self.shares.extend(shares)
        return towers, objectives

    @property
    def weight_terms(self):
        """The weights' regularization terms counted once (float32 scalars)."""
        return list(self._weight_terms or [])

    @property
    def weighted_activity(self):
        """Each tower's activity terms, weighted by its share (float32 scalars)."""
        return list(self._weighted_activity)

    def use_totals(self, towers, shares, weight_terms, weighted_activity):
        """Replaces what the towers added by their totals over an accumulation loop.

        `towers` (one per device, its loss the mean over its micro-batches),
        `shares` (sum_j n_ji / B), and the step's weight terms and weighted
        activity terms, all tensors of the graph around the loop; losses()
        then reports the whole step.
        """
        self.towers, self.shares = list(towers), list(shares)
        self._weight_terms = list(weight_terms)
        self._weighted_activity = list(weighted_activity)

    def losses(self, worker_sums=None) -> StepLosses:
        """The step's losses, built in the current device and name scope.

        Across workers, `worker_sums` is the sum over every worker's towers of
        `worker_loss_rows()` (tower 0's, or any local tower's: the same bits).
        """
        if self._sum_over_workers is not None:
            return self._losses_over_workers(worker_sums)
        loss = tf.add_n([s * t.loss for s, t in zip(self.shares, self.towers)], name="loss")
        terms = (self._weight_terms or []) + self._weighted_activity
        regularization = (tf.add_n(terms, name="regularization_loss") if terms
                          else tf.constant(0.0, name="regularization_loss"))
        return StepLosses(loss, regularization,
                          tf.add(loss, regularization, name="total_loss"))

    def worker_loss_rows(self):
        """Across workers, per local tower a float32 [2]: its weighted data loss and
        (tower 0 only) this worker's weighted activity terms; summed over every
        worker's towers they are the global batch's two parts, on each tower's device."""
        activity = (tf.add_n(self._weighted_activity) if self._weighted_activity
                    else tf.constant(0.0))
        rows = []
        for index in range(self._sum_over_workers.num_towers):
            own = [(s, t) for s, t in zip(self.shares, self.towers)
                   if t.context.index == index]
            with tf.device(own[0][1].context.device):
                loss_part = tf.add_n([s * t.loss for s, t in own])
                activity_part = activity if index == 0 else tf.zeros_like(activity)
                rows.append(tf.stack([loss_part, activity_part]))
        return rows

    def _losses_over_workers(self, summed):
        """The global batch's losses from the summed rows of worker_loss_rows()."""
        if summed is None:
            raise ValueError("Across workers the losses need worker_sums: the sum over "
                             "every worker's towers of worker_loss_rows().")
        loss = tf.identity(summed[0], name="loss")
        # The weights' terms are the same on every worker: counted once.
        regularization = tf.add_n((self._weight_terms or []) + [summed[1]],
                                  name="regularization_loss")
        return StepLosses(loss, regularization,
                          tf.add(loss, regularization, name="total_loss"))


def _loss_in_float32(tower):
    """A half-precision loss (a Keras mixed policy's, under precision float32) in float32,
    as towerlib's half precisions hand it: the towers are weighed and summed in float32."""
    if tower.loss.dtype not in (tf.float16, tf.bfloat16):
        return tower
    with tf.name_scope(tower.context.name_scope), tf.device(tower.context.device):
        return dataclasses.replace(tower, loss=tf.cast(tower.loss, tf.float32))

"""The step across workers: one object owns what crosses between them.

Across workers each process builds only its own towers, yet the step is one
update on the global batch of every worker. Four things cross besides the
gradients, and `worker_step(...)` owns them all:

- the sums for the weights: a tower's share is n_i / B with B every worker's
  examples (`WorkerSums`: one small sum over the whole collective group; a
  total fixed for the run is exchanged once, at start);
- the step's losses and, for 'first_tower' and 'sync', the chief's
  moving-statistics input: one float32 vector per tower, riding in the
  gradients' first buffer, so a step exchanges once between workers
  (`WorkerRiders`; for a ResNet-20, 2 + 2 x 688 floats beside 274,042
  gradient values);
- 'all_towers'' moving statistics, gathered alone (every tower's);
- at start, every copy set to the chief's values (the broadcast).

On one machine `worker_step` gives ONE_MACHINE, which does nothing: the build
reads the same phases either way.

    crossing = worker_step(options.workers, reducer, options.bn_mode)
    objective = StepObjective(..., sum_over_workers=crossing.sums)
    riders = crossing.riders(objective, records)               # before combine
    combined = update.combine(tower_grads_and_vars, riders=riders)
    losses = crossing.losses(objective, combined)
    shared = crossing.moving_statistics(records, combined)     # None on one machine
    train_op, broadcast_op = crossing.join(train_op, losses, variable_update)
"""

import dataclasses
import math
from typing import List, Optional

import tensorflow as tf

from towerlib.batchnorm import normalization, worker_statistics
from towerlib.update import broadcast, slot_shards

__all__ = ["FIXED_SUMS", "ONE_MACHINE", "AcrossWorkers", "OneMachine", "WorkerRiders",
           "WorkerSums", "worker_step"]


def worker_step(workers, reducer, bn_mode):
    """AcrossWorkers when `workers` (a WorkerGroup) spans several, else ONE_MACHINE."""
    return AcrossWorkers(reducer, bn_mode) if workers.spans_workers else ONE_MACHINE


class OneMachine:
    """Nothing crosses: the losses are the towers', the step is the apply."""

    sums = None  # StepObjective's sum_over_workers

    def riders(self, objective, records):
        """The vectors that ride with the gradients (combine's `riders`): none."""
        del objective, records

    def losses(self, objective, combined):
        """The step's StepLosses."""
        del combined
        return objective.losses()

    def decided_on(self, losses, objective):
        """The losses the NaN guard and the loss scale decide on: every tower's."""
        del losses
        return [t.loss for t in objective.towers]

    def moving_statistics(self, records, combined):
        """{layer: per local tower (mean, variance)} every worker shares: None here."""
        del records, combined

    def join(self, train_op, losses, variable_update):
        """(train_op, broadcast_op): as built, and no broadcast."""
        del losses, variable_update
        return train_op, None


ONE_MACHINE = OneMachine()


class AcrossWorkers(OneMachine):
    """The step's sums, riders, moving statistics and broadcast across workers.

    Args:
      reducer: the build's CrossTowerReducer spanning every worker's towers.
      bn_mode: the build's BnMode.
    """

    def __init__(self, reducer, bn_mode):
        self._reducer, self._bn_mode = reducer, bn_mode
        self.sums = WorkerSums(reducer)
        self._riders = None

    def riders(self, objective, records):
        with tf.name_scope("worker_riders"):
            self._riders = WorkerRiders.build(objective, records, self._bn_mode,
                                              self._reducer)
        return [[vector] for vector in self._riders.vectors]

    def losses(self, objective, combined):
        return self._riders.losses(objective, combined.riders)

    def decided_on(self, losses, objective):
        # Every worker decides on the global loss, which all share.
        del objective
        return [losses.loss]

    def moving_statistics(self, records, combined):
        carried = self._riders.statistics(records, combined.riders)
        if carried is not None:
            return carried
        return normalization.statistics_across_workers(records, self._bn_mode, self._reducer)

    def join(self, train_op, losses, variable_update):
        """Every step computes the global losses (no worker may skip their exchange);
        one op, run once at start, sets every copy to the chief's values and the
        fixed sums."""
        train_op = tf.group(train_op, losses.loss, name="train_op_across_workers")
        self._reducer.start_separate_run()  # run once at start, never with a step
        # Slots sharded over the workers are each one worker's: not broadcast.
        shards = getattr(variable_update, "slots_over_workers", ())
        sharded = {shard.name for shard in shards}
        broadcast_op = tf.group(
            broadcast.broadcast_from_chief(
                self._reducer, [v for v in tf.compat.v1.global_variables()
                                if v.op.name not in sharded], variable_update.copies),
            self.sums.start_op())
        if shards:   # their gather for every save, and their refill at a restart
            chunk_bytes = broadcast.DEFAULT_CHUNK_BYTES
            self._reducer.start_separate_run()
            with tf.name_scope("slots_for_saving"):
                slot_shards.saveables(self._reducer, shards, chunk_bytes)
            self._reducer.start_separate_run()
            with tf.name_scope("slots_finite"):
                slot_shards.finite_everywhere(self._reducer, shards)
            self._reducer.start_separate_run()
            with tf.name_scope("slots_from_chief"):
                slot_shards.fill_op(self._reducer, shards, chunk_bytes)
        return train_op, broadcast_op


# The graph collection of the sums a build exchanges once at start: every worker must
# make the same ones (towerlib.cluster.agreement compares them before the first step).
FIXED_SUMS = "towerlib_worker_sums_fixed_at_start"


class WorkerSums:
    """Scalar (or small vector) sums over the whole group, per local tower.

    Args:
      reducer: the build's CrossTowerReducer spanning the workers.
    """

    def __init__(self, reducer):
        self._reducer = reducer
        self._fixed = []  # (name, per local tower (its value, its variable))

    @property
    def num_towers(self):
        """This worker's towers."""
        return self._reducer.num_towers

    def __call__(self, values, name):
        """Per local tower, the sum over every tower of `values` (one per local tower).

        Integer-valued float32 sums (example counts) are exact up to 2**24.
        """
        self._check_count(values, name)
        return [self._reducer.sum(tf.cast(value, tf.float32), tower_index=index,
                                  name=f"across_workers_{name}", differentiable=False)
                for index, value in enumerate(values)]

    def fixed(self, values, name):
        """Like `__call__` for Python numbers fixed for the run: exchanged once, at start.

        Returns per local tower a float32 scalar read from a local variable on its
        device, which `start_op()` sets to the sum. Until then it is NaN, so a
        step run before the start op shows a NaN loss, not a wrong one.
        """
        self._check_count(values, name)
        variables = []
        for index, value in enumerate(values):
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                raise TypeError(f"{name}: fixed sums take finite Python numbers, got {value!r}.")
            with tf.device(self._reducer.devices[index]):
                variables.append(tf.compat.v1.Variable(
                    math.nan, dtype=tf.float32, trainable=False, use_resource=True,
                    collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES],
                    name=f"across_workers_{name}_at_start"))
        self._fixed.append((name, list(zip(values, variables))))
        tf.compat.v1.add_to_collection(FIXED_SUMS, name)
        return [variable.read_value() for variable in variables]

    def start_op(self):
        """One op setting every `fixed` total (a no-op when there is none).

        Build it after the step (reducer.start_separate_run()), every worker in the
        same order, and run it once before the first step on every worker.
        """
        assigns = []
        with tf.name_scope("worker_sums_at_start"):
            for name, pairs in self._fixed:
                for index, (value, variable) in enumerate(pairs):
                    with tf.device(self._reducer.devices[index]):
                        total = self._reducer.sum(
                            tf.constant(value, tf.float32), tower_index=index,
                            name=f"across_workers_{name}_at_start", differentiable=False)
                        assigns.append(variable.assign(total, read_value=False))
        return tf.group(*assigns)

    def _check_count(self, values, name):
        if len(values) != self.num_towers:
            raise ValueError(f"{name}: {len(values)} values for {self.num_towers} towers.")


@dataclasses.dataclass(frozen=True)
class WorkerRiders:
    """Per local tower, the vector to sum: [losses (2), moving statistics (or none)].

    Attributes:
      vectors: per local tower one float32 vector (the `riders` of combine).
      carries_statistics: whether the moving statistics are in it.
    """

    vectors: List[tf.Tensor]
    carries_statistics: bool

    @classmethod
    def build(cls, objective, records, bn_mode, reducer) -> "WorkerRiders":
        loss_rows = objective.worker_loss_rows()
        statistics = worker_statistics.chiefs_rows(records.batch_norm, bn_mode, reducer)
        if statistics is None:
            return cls(loss_rows, carries_statistics=False)
        vectors = []
        for index, (losses, moving) in enumerate(zip(loss_rows, statistics)):
            with tf.device(reducer.devices[index]):
                vectors.append(tf.concat([losses, moving], axis=0, name="worker_riders"))
        return cls(vectors, carries_statistics=True)

    def losses(self, objective, summed):
        """The step's StepLosses from the summed riders (per tower, [vector])."""
        totals = [riders[0] for riders in summed]
        # Every local tower's half of the exchange runs when the loss is read.
        with tf.control_dependencies(totals[1:]):
            return objective.losses(worker_sums=tf.identity(totals[0][:2]))

    def statistics(self, records, summed) -> Optional[dict]:
        """{layer: per local tower (mean, variance)}, or None when not carried."""
        if not self.carries_statistics:
            return None
        return worker_statistics.from_chiefs_rows(
            records.batch_norm, [riders[0][2:] for riders in summed])

"""The step's small sums across workers, carried in the gradients' all-reduce.

Across workers a step needs two small sums over every worker's towers besides
the gradients: the global batch's losses (towerlib.step.objective) and, for
bn_mode 'first_tower' and 'sync', the chief's moving-statistics input
(towerlib.batchnorm.worker_statistics). Each was an exchange of its own, a
round trip between the workers every step. Here they are one float32 vector
per tower, appended to the gradients' first buffer (towerlib.update.allreduce),
so a step exchanges once between workers. For a ResNet-20: 2 + 2 x 688 floats
beside 274,042 gradient values.

    riders = WorkerRiders.build(objective, records, bn_mode, reducer)  # before combine
    combined = update.combine(tower_grads_and_vars, riders=[[v] for v in riders.vectors])
    losses = riders.losses(objective, combined.riders)
    shared = riders.statistics(records, combined.riders)  # None: exchange them alone

The sums are the same bits on every tower of every worker, as the
gradients' are. The global loss is read after the gradients' exchange, so
fetching `loss` runs the backward pass (a train op does anyway).
"""

import dataclasses
from typing import List, Optional

import tensorflow as tf

from towerlib.batchnorm import worker_statistics

__all__ = ["WorkerRiders"]


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

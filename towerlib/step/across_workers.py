"""Sums over every tower of every worker, for the step's weights and losses.

Across workers each process builds only its own towers, yet a tower's share
of the objective is n_i / B with B the examples of EVERY worker, and the
loss a worker reports is the global batch's. Both are one small sum over
the whole collective group (towerlib.exchange.CrossTowerReducer with a
WorkerGroup): each local tower contributes a scalar, every tower receives
the total.

    sums = WorkerSums(reducer)
    totals = sums([count_0, count_1], "tower_examples")   # one total per tower
    loss = sums.once([part_0, part_1], "losses")          # one tensor

A collective completes only when every member runs its half, so a total is
read by its own tower (`__call__`), or `once` ties all the local halves to
the one result read.
"""

import tensorflow as tf

__all__ = ["WorkerSums"]


class WorkerSums:
    """Scalar (or small vector) sums over the whole group, per local tower.

    Args:
      reducer: the build's CrossTowerReducer spanning the workers.
    """

    def __init__(self, reducer):
        self._reducer = reducer

    @property
    def num_towers(self):
        """This worker's towers."""
        return self._reducer.num_towers

    def __call__(self, values, name):
        """Per local tower, the sum over every tower of `values` (one per local tower).

        Integer-valued float32 sums (example counts) are exact up to 2**24.
        """
        if len(values) != self.num_towers:
            raise ValueError(f"{name}: {len(values)} values for {self.num_towers} towers.")
        return [self._reducer.sum(tf.cast(value, tf.float32), tower_index=index,
                                  name=f"across_workers_{name}", differentiable=False)
                for index, value in enumerate(values)]

    def once(self, values, name):
        """The sum, once: tower 0's result, which runs every local tower's half."""
        totals = self(values, name)
        with tf.control_dependencies(totals[1:]):
            return tf.identity(totals[0])

"""Sums over every tower of every worker, for the step's weights.

Across workers each process builds only its own towers, yet a tower's share
of the objective is n_i / B with B the examples of EVERY worker: one small
sum over the whole collective group (towerlib.exchange.CrossTowerReducer
with a WorkerGroup): each local tower contributes a scalar, every tower
receives the total, read by its own tower (a collective completes only when
every member runs its half). The losses ride in the gradients' exchange
instead (towerlib.step.worker_riders).

    sums = WorkerSums(reducer)
    totals = sums([count_0, count_1], "tower_examples")   # one total per tower

A total that cannot change during the run (the examples of batches whose
size is static) is exchanged once, at start, not every step:

    totals = sums.fixed([32, 32], "tower_examples")        # a local variable's reads
    start = sums.start_op()   # built after reducer.start_separate_run(): run it once,
                              # with the broadcast, before the first step
"""

import math

import tensorflow as tf

__all__ = ["FIXED_SUMS", "WorkerSums"]

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

"""Across workers with several CPU towers each: a hub per worker, a collective between.

A flat collective group over every tower of every worker (W x N members) is a
ring of W x N steps, N - 1 of every N of them hand-offs inside one process.
On CPU towers an exchange inside a process is cheaper through graph edges
(towerlib.exchange.graph_hub), so this transport exchanges in two levels:

  1. the worker's N towers' rows meet in one ConcatV2 on its first tower's
     device (the hub: a [N, K] block, in tower order);
  2. the W blocks meet in one all-gather per worker (W members), [W x N, K]
     worker by worker in the collective's rank order (sorted device names,
     so member order for up to 10 workers).

A sum then adds the W x N rows with one AddN in that order: the op, the
inputs and the order of one process's graph hub (the CPU default) over
W x N towers. So 2 workers x 2 CPU towers compute the same bits as one
process with 4 towers on the same kind of machine, and a run resized
between them goes on as if it had not been. An AddN in each worker and an
all-reduce of the W partial sums would round differently: a ReLU input
within rounding of 0 then flips, and with it a gradient, and the runs drift
apart (1e-4 in 6 steps of the CIFAR-10 example's ResNet-8, sync batch norm).
The gather brings each worker (W - 1) x N rows, so beyond 4 towers in all a
sum whose W x N copies exceed GATHER_UP_TO_ELEMENTS (gradients) takes the
two levels after all; smaller ones (batch-norm statistics, usually) are
gathered, as the flat group gathers them.

Every tower of the worker reads the one output. For 2 x 2 an exchange is
one ring step between the processes, against 3 for the flat group of 4.
Between GPUs, NCCL chooses its own topology: the flat group stays
(towerlib.exchange.transport_rules).
"""

import tensorflow as tf

from towerlib.exchange.collective_transport import GATHER_UP_TO_ELEMENTS, CollectiveTransport
from towerlib.exchange.graph_hub import GraphHubTransport

__all__ = ["WorkerHubTransport"]

# A sum gathers every tower's row, and adds them as one process does, up to
# this many towers in all (each worker then receives at most twice a ring
# all-reduce's bytes), or while the gathered copies are few (as the flat group).
_EXACT_UP_TO_TOWERS = 4


class WorkerHubTransport:
    """Sums and gathers over every worker's towers: hub per worker, then a collective.

    Args:
      devices: this worker's tower devices (full names: job, task, device).
      group_key: the collective group key of the W workers' hubs.
      communication_hint, timeout_seconds: the collective's (see CollectiveTransport).
      num_workers: W, the members of the collective group.
    """

    rows_in_tower_order = False  # the workers' blocks come in rank order
    one_output_for_every_tower = True

    def __init__(self, devices, group_key, communication_hint, timeout_seconds, num_workers):
        self._hubs = GraphHubTransport(devices)
        self._between = CollectiveTransport(
            devices[:1], group_key, communication_hint, timeout_seconds, ordered=False,
            group_size=num_workers)
        self._members = num_workers * len(devices)
        self._results = {}  # instance key -> what every tower reads
        self._in_levels = {}  # instance key -> whether the sum goes in two levels

    def sum(self, vector, tower_index, key, name):
        """[K]: the sum over every tower of every worker.

        Small vectors, and any vector up to 4 towers in all: the W x N rows
        gathered, then added by one AddN in member order, as one process adds
        them. Otherwise the worker's AddN, then a sum of the W partial sums
        (an all-reduce; a gather for a vector this small): a gather of every
        row would bring each worker (W - 1) x N copies. The call's first
        tower chooses, and every tower follows it.
        """
        size = vector.shape.num_elements()
        in_levels = self._in_levels.setdefault(key, self._members > _EXACT_UP_TO_TOWERS and (
            size is None or size * self._members > GATHER_UP_TO_ELEMENTS))
        if in_levels:
            local = self._hubs.sum(vector, tower_index, key, name)
            return self._shared_once(key, local.op.device,
                                     lambda: self._between.sum(local, 0, key, name))
        rows = self.gather(vector[tf.newaxis], tower_index, key, name)
        return self._shared_once(("sum", key), rows.op.device,
                                 lambda: tf.math.add_n(tf.unstack(rows, axis=0)))

    def gather(self, row, tower_index, key, name):
        """[W x N, K]: every tower's [1, K] row, worker blocks in rank order."""
        local = self._hubs.gather(row, tower_index, key, name)  # [N, K]
        return self._shared_once(key, local.op.device,
                                 lambda: self._between.gather(local, 0, key, name))

    def _shared_once(self, key, device, build):
        """What every tower of the call reads, built once by its first tower in a clean
        context (not that tower's control dependencies or colocation), on `device`:
        the hub's, which has the job and task a bare device name lacks."""
        result = self._results.get(key)
        if result is None:
            graph = tf.compat.v1.get_default_graph()
            with tf.control_dependencies(None), \
                    graph.colocate_with(None, ignore_existing=True), tf.device(device):
                result = build()
            self._results[key] = result
        return result

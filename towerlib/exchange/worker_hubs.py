"""Across workers with CPU towers: a graph hub in each worker, one collective between.

A flat collective group over every tower of every worker (W x N members) is a
ring of W x N steps, N - 1 of every N of them hand-offs inside one process.
On CPU towers an exchange inside a process is cheaper through graph edges
(towerlib.exchange.graph_hub), so this transport exchanges in two levels:

  1. the worker's N towers meet in one hub op on its first tower's device
     (an AddN for a sum, a ConcatV2 of their rows for a gather);
  2. the W hubs' outputs meet in one collective op per worker (W members).

Every tower of the worker reads that one output: the same bits on every
tower of every worker. Rows of a gather come worker by worker in the
collective's rank order, each worker's rows in tower order; the reducer puts
them in member order (its row tags), as for a flat collective.

With 2 workers of 2 towers an all-reduce of S bytes then takes 2 ring steps
and sends 2 S between the processes, against 6 steps and 3 S for the flat
group of 4. Between GPUs, NCCL already chooses its own topology: the flat
group stays (towerlib.exchange.transport_rules).
"""

import tensorflow as tf

from towerlib.exchange.collective_transport import CollectiveTransport
from towerlib.exchange.graph_hub import GraphHubTransport

__all__ = ["WorkerHubTransport"]


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
        self._results = {}  # instance key -> the collective's output

    def sum(self, vector, tower_index, key, name):
        """[K]: the sum over every tower of every worker."""
        local = self._hubs.sum(vector, tower_index, key, name)
        return self._between_workers(key, lambda: self._between.sum(local, 0, key, name))

    def gather(self, row, tower_index, key, name):
        """[W x N, K]: every tower's [1, K] row, worker blocks in rank order."""
        local = self._hubs.gather(row, tower_index, key, name)  # [N, K]
        return self._between_workers(key, lambda: self._between.gather(local, 0, key, name))

    def _between_workers(self, key, build):
        """The call's one collective, built by its first tower in a clean context: it
        must not inherit that tower's control dependencies or colocation."""
        result = self._results.get(key)
        if result is None:
            graph = tf.compat.v1.get_default_graph()
            with tf.control_dependencies(None), graph.colocate_with(None, ignore_existing=True):
                result = build()
            self._results[key] = result
        return result

"""The 'collective' transport: TensorFlow collective ops, NCCL between GPUs.

One op per tower and call, on the tower's own device, all with the reducer's
group key and the call's instance key, paired at run time by those keys: so
each tower can be built alone, and no value crosses to a parameter device.
With communication_hint='nccl' (the default when every tower is a GPU) the
ops are NCCL kernels between the GPUs.

NCCL kernels launched in different orders on different GPUs deadlock, so
when ``ordered`` each of a tower's collectives gets a control dependency on
the tower's previous one (in creation order, which is a topological order:
these edges never make a cycle). The CPU ring pairs ops by instance key and
needs no order, so there the ops stay free to run as soon as they can.
"""

import tensorflow as tf

from towerlib.internals import collective_ops

__all__ = ["GATHER_UP_TO_ELEMENTS", "CollectiveTransport"]

# Off NCCL, a sum whose gathered copies (num_towers x size) stay under this
# many elements is computed as an all-gather plus a local sum (see sum()).
GATHER_UP_TO_ELEMENTS = 1 << 16


class CollectiveTransport:
    """Moves a reducer's values with collective ops, one per tower and call.

    Args:
      devices: one device string per tower.
      group_key: the collective group key these towers share.
      communication_hint: 'nccl', 'ring' or 'auto'.
      timeout_seconds: each op's own timeout, or None for none.
      ordered: chain each tower's collectives in creation order.
      group_size: members of the collective group: len(devices) on one
        machine, every worker's towers across machines.

    Rows of a gather come in the collective's rank order, which TensorFlow
    chooses (sorted device names on CPU, the interconnect on GPUs), not in
    tower order: the reducer puts them back.
    """

    rows_in_tower_order = False

    def __init__(self, devices, group_key, communication_hint, timeout_seconds, ordered,
                 group_size=None):
        self._devices = devices
        self._group_size = len(devices) if group_size is None else group_size
        self._group_key = group_key
        self._communication_hint = communication_hint
        self._timeout_seconds = timeout_seconds
        self._ordered = ordered
        # Per tower, the last collective op built, to chain the next one after it.
        self._last_collective = [None for _ in devices]

    def sum(self, tensor, tower_index, instance_key, name):
        """Sum over towers of `tensor` ([K]), by one collective on this tower.

        A ring all-reduce takes 2 (T - 1) steps one after the other; a ring
        all-gather T - 1. For the small vectors of batch-norm statistics the
        steps' latency is the whole cost (on CPU each is a thread hand-off),
        so off NCCL small sums gather every tower's vector and add them up
        locally, in the collective's rank order, which is the same on every
        tower: so is every bit of the sum.
        """
        size = tensor.shape.num_elements()
        if (
            self._communication_hint != "nccl"
            and size is not None
            and size * self._group_size <= GATHER_UP_TO_ELEMENTS
        ):
            gathered = self.gather(tensor[tf.newaxis], tower_index, instance_key, name)
            with tf.device(self._devices[tower_index]):
                return tf.reduce_sum(gathered, axis=0)
        return self._launch(collective_ops.all_reduce, tensor, tower_index, instance_key)

    def gather(self, tensor, tower_index, instance_key, name):
        """[group_size x R, K]: every member's [R, K] rows, by one all-gather op (along
        axis 0) on this tower's device."""
        del name  # the caller's name scope names the op
        out = self._launch(collective_ops.all_gather, tensor, tower_index, instance_key)
        rows = tensor.shape[0]
        out.set_shape([None if rows is None else self._group_size * rows]
                      + tensor.shape.as_list()[1:])
        return out

    def _launch(self, collective, tensor, tower_index, instance_key):
        """One collective op of this group on the tower's device, in creation order."""
        with tf.device(self._devices[tower_index]):
            with tf.control_dependencies(self._order_after(tower_index)):
                out = collective(tensor, self._group_size, self._group_key, instance_key,
                                 self._communication_hint, self._timeout_seconds)
        self._last_collective[tower_index] = out.op
        return out

    def start_new_order(self):
        """The next collectives start a chain of their own (a run of their own)."""
        self._last_collective = [None for _ in self._devices]

    def _order_after(self, tower_index):
        """Control inputs that keep this tower's collectives in creation order."""
        previous = self._last_collective[tower_index]
        if not self._ordered or previous is None:
            return []
        return [previous]

"""CrossTowerReducer: sums and gathers across the towers of one graph build.

Every tower of a build calls the same reductions in the same order. The k-th
call in tower 0 is paired with the k-th call in every other tower (see
towerlib.exchange.ledger), and a transport moves the values:

    reducer = CrossTowerReducer(["/device:GPU:0", "/device:GPU:1"])
    for i, device in enumerate(reducer.devices):
        with tf.device(device):
            total = reducer.sum(local_stats, tower_index=i, name="bn1")
    reducer.check_consistent()  # once every tower (and its gradients) is built

With local_stats = [1., 2.] in tower 0 and [3., 4.] in tower 1, `total` is
[4., 6.] in both towers, and the gradient reaching each tower's local_stats
is the sum of both towers' incoming gradients.

The reductions are exact in both directions. Neither transport passes a
gradient by itself (collective ops have none registered; a hub ends in a
StopGradient), so each call is wrapped in a ``tf.custom_gradient`` whose
backward is itself a reduction with its own key:

  * ``sum``: y = sum_t x_t on every tower, so dL/dx_i = sum_t dL_t/dy_t: the
    backward is a sum of the incoming gradients.
  * ``gather``: y = [x_0; ...; x_{T-1}] on every tower, so dL/dx_i is row i of
    sum_t dL_t/dy_t: a sum followed by taking this tower's row.

A layer that writes its own backward calls ``sum(..., in_gradient=True)``
from its gradient function; such calls pair by the order tf.gradients builds
them.
"""

import numbers
from typing import Optional, Sequence

import tensorflow as tf

from towerlib.exchange import (
    collective_transport,
    graph_hub,
    keys,
    ledger,
    packing,
    transport_rules,
    worker_hubs,
)
from towerlib.exchange.group import ONE_WORKER, WorkerGroup
from towerlib.exchange.transport_rules import TRANSPORTS
from towerlib.internals import function_graphs

__all__ = ["TRANSPORTS", "CrossTowerReducer"]


# Tower indices that a row tag of these dtypes represents exactly.
_EXACT_INTEGERS = {tf.float16: 2048, tf.bfloat16: 256}


class CrossTowerReducer:
    """Sums or gathers tensors across the towers of one graph build.

    Args:
      devices: one device string per tower, e.g. '/device:GPU:0' or
        '/device:CPU:3'; tower i's collectives are placed on devices[i], the
        graph transport's hub ops on devices[0].
      group_key: collective group key shared by these towers. None (the
        default) allocates a key unique within the current graph. Only for
        the 'collective' transport.
      timeout_seconds: None (default) or how long each collective op waits
        for the other towers before failing with DeadlineExceededError. Off
        by default because TF 2.21 implements it with one thread per op and
        step that sleeps for the whole timeout; prefer check_fetches and a
        Session deadline (bounded_session_config). Worth it for debugging a
        short run, where it names the collective that waited.
      communication_hint: 'nccl', 'ring' or 'auto'. None picks 'nccl' when every
        device is a GPU and 'auto' (ring) otherwise.
      ordered: chain each tower's collectives in creation order with control
        dependencies. None means: only for 'nccl', which needs it.
      transport: 'collective' (collective ops, paired by key at run time) or
        'graph' (one hub op per reduction, fed by every tower through graph
        edges: towerlib.exchange.graph_hub). None picks 'collective' when every
        device is a GPU, for NCCL, and 'graph' otherwise: on CPU devices it
        is far cheaper than a collective ring and cannot hang. The
        arguments above only concern the 'collective' transport.
      workers: a towerlib.exchange.WorkerGroup when the exchange spans the
        towers of several worker processes, every worker building the same
        calls in the same order (collectives only: one group of W x N
        members, or with several CPU towers a hub per worker and a group of
        W, towerlib.exchange.worker_hubs). Tower indices stay this worker's.

    With one device in all nothing is exchanged: ``sum`` is the identity and
    ``gather`` adds a leading axis of size 1.
    """

    def __init__(self, devices: Sequence[str], group_key: Optional[int] = None,
                 timeout_seconds: Optional[float] = None,
                 communication_hint: Optional[str] = None, ordered: Optional[bool] = None,
                 transport: Optional[str] = None, workers: WorkerGroup = ONE_WORKER):
        devices = list(devices)
        transport, communication_hint = transport_rules.check_reducer_options(
            devices, group_key, timeout_seconds, communication_hint, transport,
            spans_workers=workers.spans_workers)
        self._workers = workers
        self._group_size = workers.size(len(devices))

        self._graph = tf.compat.v1.get_default_graph()
        self._keys = keys.allocator_for(self._graph)
        self._transport = transport
        if self._group_size > 1 and transport == "collective":
            if group_key is None:
                group_key = self._keys.new_group_key()
            else:
                self._keys.claim_group_key(int(group_key))
        self._devices = devices
        self._group_key = group_key
        self._timeout_seconds = None if timeout_seconds is None else float(timeout_seconds)
        self._communication_hint = communication_hint
        self._ordered = (communication_hint == "nccl") if ordered is None else bool(ordered)
        # What moves the values: both offer sum() and gather() per tower and key.
        if transport == "graph":
            self._channel = graph_hub.GraphHubTransport(devices)
        elif transport_rules.hubs_per_worker(devices, workers, communication_hint):
            self._channel = worker_hubs.WorkerHubTransport(
                devices, group_key, communication_hint, self._timeout_seconds,
                workers.num_workers)
        else:
            self._channel = collective_transport.CollectiveTransport(
                devices, group_key, communication_hint, self._timeout_seconds, self._ordered,
                group_size=self._group_size)

        # Pairs the k-th call of every tower and gives it its key.
        self._ledger = ledger.CallLedger(len(devices), self._keys.new_instance_key)
        # Instance key -> the unpacked tensors of a sum every tower reads alike.
        self._shared_sums = {}

    devices = property(lambda self: list(self._devices), doc="This worker's tower devices.")
    num_towers = property(lambda self: len(self._devices),
                          doc="This worker's towers (the valid `tower_index` values).")
    workers = property(lambda self: self._workers, doc="The WorkerGroup.")
    group_size = property(lambda self: self._group_size,
                          doc="Every tower of every worker: the rows of a gather.")

    def member(self, tower_index: int) -> int:
        """This worker's tower `tower_index` as a member of the whole group."""
        return self._workers.member(tower_index, len(self._devices))

    # The constructor's choices, resolved ('collective' or 'graph'; the group key
    # is None for one tower or the graph transport; the timeout None for none).
    transport = property(lambda self: self._transport)
    group_key = property(lambda self: self._group_key)
    timeout_seconds = property(lambda self: self._timeout_seconds)
    communication_hint = property(lambda self: self._communication_hint)
    ordered = property(lambda self: self._ordered, doc="Each tower's collectives chained.")

    def num_calls(self, tower_index: int) -> int:
        """Forward reductions tower `tower_index` has built so far."""
        return self._ledger.num_calls(tower_index)

    # ---------------------------------------------------------------- public ops

    def sum(
        self,
        tensors,
        tower_index: int,
        name: Optional[str] = None,
        in_gradient: bool = False,
        differentiable: bool = True,
    ):
        """Element-wise sum over towers of `tensors`, on every tower.

        Args:
          tensors: a tensor or a list of tensors of one dtype; each must have the
            same shape in every tower. A list goes through ONE exchange (its
            tensors are flattened and concatenated), which is what keeps the
            cost per batch-norm layer to one round trip.
          tower_index: which tower is calling, 0 <= tower_index < num_towers.
          name: names the call in errors and in the graph (e.g. the layer).
          in_gradient: True when called from a gradient function (a
            tf.custom_gradient backward): the call is then paired and checked
            with the other towers' backward calls, in the order tf.gradients
            builds them, with instance keys of its own.
          differentiable: False leaves out the gradient wrapper (two IdentityN
            ops per call), for callers whose own tf.custom_gradient already
            covers the call.

        Returns:
          The same structure as `tensors`: each tensor summed over all towers
          (on this tower's device through collectives; through hubs, the one
          output every tower reads, on devices[0]). Differentiable:
          the gradient is the sum of all towers' incoming gradients (exact
          data-parallel gradient).
        """
        return self._reduce("sum", tensors, tower_index, name, in_gradient, differentiable)

    def gather(self, tensors, tower_index: int, name: Optional[str] = None):
        """Every tower's `tensors`, stacked along a new leading tower axis.

        Across workers the axis has every worker's towers, worker-major
        (`group_size` rows; this worker's tower i is row `member(i)`).

        Args:
          tensors: a tensor or a list of tensors of one dtype, with the same shape
            in every tower (one exchange for the whole list).
          tower_index: which tower is calling.
          name: names the call in errors and in the graph.

        Returns:
          The same structure as `tensors`: a tensor of shape
          [group_size, *shape] whose row t is tower t's value. Differentiable:
          the gradient for this tower's input is its row of the sum of all
          towers' incoming gradients.

        Row order. An all-gather stacks rows in the collective's rank order
        (sorted device names on CPU, the interconnect's on GPUs), so each row
        travels with its tower index and the rows are put back in order (on
        GPUs InvertPermutation runs on the host). ``gather_unordered`` skips
        that, for combinations that do not care about the order.
        """
        return self._reduce("gather", tensors, tower_index, name)

    def gather_unordered(self, tensors, tower_index: int, name: Optional[str] = None):
        """Like ``gather``, with rows in the transport's order.

        That is the collective's rank order (through per-worker hubs: worker
        blocks in rank order, towers in order within each), or tower order
        through the graph transport.

        The order is the same on every tower, so a combination computed from
        the rows (a sum over them, say) comes out bit for bit the same on
        every tower; but row t need not be tower t's. Not differentiable: for
        callers whose own tf.custom_gradient covers the call, like
        batch_norm's synchronized statistics.
        """
        return self._reduce("gather_unordered", tensors, tower_index, name)

    def start_separate_run(self) -> None:
        """The calls from now on run in a session.run of their own (a broadcast at
        start): their collectives are not chained after the step's."""
        restart = getattr(self._channel, "start_new_order", None)
        if restart is not None:
            restart()

    def check_consistent(self) -> None:
        """Raises CollectiveMismatchError unless all towers made the same calls.

        Call it once every tower has been built, including its gradients (the
        backward exchanges are built by tf.gradients and are checked too).
        Per-call shapes and dtypes are already checked as the calls are made;
        this adds the check only possible at the end: the number of calls.
        """
        self._ledger.check_counts("forward")
        self._ledger.check_counts("backward")

    # -------------------------------------------------------------- internals

    def _check_tower(self, tower_index):
        if (isinstance(tower_index, bool) or not isinstance(tower_index, numbers.Integral)
                or not 0 <= tower_index < len(self._devices)):
            raise ValueError(f"tower_index must be an int in [0, {len(self._devices)}), "
                             f"got {tower_index!r}.")
        # An accumulated step's towers are built in a while-loop body within it.
        if not function_graphs.is_inside(tf.compat.v1.get_default_graph(), self._graph):
            raise ValueError(
                "CrossTowerReducer used in a different graph than the one it was "
                "created in. Create the reducer in the graph that holds the towers, "
                "and call it in that graph.")

    def _reduce(self, kind, tensors, tower_index, name, in_gradient=False, differentiable=True):
        self._check_tower(tower_index)
        tower_index = int(tower_index)
        single = not isinstance(tensors, (list, tuple))
        flat = [tf.convert_to_tensor(t) for t in ([tensors] if single else tensors)]
        if not flat:
            raise ValueError(f"CrossTowerReducer.{kind} got an empty list.")
        dtypes = {t.dtype for t in flat}
        if len(dtypes) != 1:
            raise ValueError(
                f"CrossTowerReducer.{kind} ({name}) got tensors of several dtypes "
                f"{sorted(d.name for d in dtypes)}; one call packs its tensors into "
                "one collective, so they must share a dtype. Cast them, or make one "
                "call per dtype."
            )
        name = name or f"cross_tower_{kind}"
        direction = "backward" if in_gradient else "forward"
        record = ledger.CallRecord(
            kind + ("/backward" if in_gradient else ""),
            name,
            tuple(ledger.shape_tuple(t) for t in flat),
            flat[0].dtype.name,
        )
        instance_key = self._ledger.record(direction, tower_index, record)

        with tf.name_scope(f"{packing.scope_name(name)}_cross_tower_{kind}"):
            if self._group_size == 1:
                result = flat if kind == "sum" else [t[tf.newaxis] for t in flat]
                return result[0] if single else result
            with tf.device(self._devices[tower_index]):
                packed, unpack = packing.pack(flat)
                if kind == "sum":
                    if differentiable:
                        reduced = self._differentiable_sum(packed, tower_index, instance_key, name)
                        result = unpack(reduced, leading=[])
                    else:
                        reduced = self._channel.sum(
                            packed, tower_index, instance_key,
                            name + "/backward" if in_gradient else name)
                        result = self._unpacked_sum(reduced, unpack, instance_key, in_gradient)
                else:
                    row = packed[tf.newaxis]
                    if kind == "gather":
                        gathered = self._gather_in_tower_order(row, tower_index, instance_key, name)
                    else:
                        gathered = self._channel.gather(row, tower_index, instance_key, name)
                    result = unpack(gathered, leading=[self._group_size])
        return result[0] if single else result

    def _unpacked_sum(self, reduced, unpack, instance_key, in_gradient):
        """The tensors of a summed buffer no gradient goes through.

        Through the graph transport every tower reads the hub's one output,
        so its pieces are cut once, next to the hub (one split per buffer,
        not one per tower), free of the first caller's control dependencies.
        Through collectives or in a gradient function each tower unpacks its own.
        """
        if in_gradient or not getattr(self._channel, "one_output_for_every_tower", False):
            return unpack(reduced, leading=[])
        shared = self._shared_sums.get(instance_key)
        if shared is None:
            with tf.control_dependencies(None), \
                    self._graph.colocate_with(reduced.op, ignore_existing=True):
                shared = unpack(reduced, leading=[])
            self._shared_sums[instance_key] = shared
        return list(shared)

    def _backward_key(self, kind, tower_index, name, grad):
        record = ledger.CallRecord(
            kind + "/backward", name, (ledger.shape_tuple(grad),), grad.dtype.name)
        return self._ledger.record("backward", tower_index, record)

    def _differentiable_sum(self, packed, tower_index, forward_key, name):
        @tf.custom_gradient
        def cross_tower_sum(x):
            def grad(upstream):
                key = self._backward_key("sum", tower_index, name, upstream)
                return self._channel.sum(upstream, tower_index, key, name + "/backward")

            return self._channel.sum(x, tower_index, forward_key, name), grad

        return cross_tower_sum(packed)

    def _gather_in_tower_order(self, row, tower_index, forward_key, name):
        """[num_towers, K] with row t from tower t, whatever the ranks' order."""

        if self._channel.rows_in_tower_order:
            return self._gather_rows_in_order(row, tower_index, forward_key, name)
        exact_up_to = _EXACT_INTEGERS.get(row.dtype.base_dtype)
        if exact_up_to is not None and self._group_size > exact_up_to:
            raise ValueError(
                f"CrossTowerReducer.gather ({name}) tags each row with its tower "
                f"index in the rows' dtype, and {row.dtype.name} holds integers "
                f"exactly only up to {exact_up_to}; this reducer has "
                f"{self._group_size} towers. Cast the tensors to float32 first."
            )
        member = self.member(tower_index)

        @tf.custom_gradient
        def cross_tower_gather(x):
            tagged = tf.concat([tf.constant([[member]], x.dtype), x], axis=1)
            rows = self._channel.gather(tagged, tower_index, forward_key, name)
            # Column 0 maps rank -> tower; its inverse says where tower t's row is.
            rank_of_tower = tf.math.invert_permutation(tf.cast(rows[:, 0], tf.int32))
            in_tower_order = tf.gather(rows[:, 1:], rank_of_tower)
            return in_tower_order, self._gather_gradient(tower_index, name)

        return cross_tower_gather(row)

    def _gather_rows_in_order(self, row, tower_index, forward_key, name):
        """The gather of a channel whose rows come in tower order already."""

        @tf.custom_gradient
        def cross_tower_gather(x):
            rows = self._channel.gather(x, tower_index, forward_key, name)
            return rows, self._gather_gradient(tower_index, name)

        return cross_tower_gather(row)

    def _gather_gradient(self, tower_index, name):
        """Gradient of a gather for this tower: its row of the towers' sum."""

        member = self.member(tower_index)

        def grad(upstream):  # [group_size, K] in member order
            key = self._backward_key("gather", tower_index, name, upstream)
            total = self._channel.sum(upstream, tower_index, key, name + "/backward")
            return total[member : member + 1]

        return grad

"""Cross-tower reductions for graph mode: the primitive under bn_mode='sync'.

Every tower of a build calls the same reductions in the same order. The k-th
call in tower 0 is paired with the k-th call in every other tower by sharing a
collective *instance key*; all towers of one reducer share a *group key*.

    reducer = CrossTowerReducer(["/device:GPU:0", "/device:GPU:1"])
    for i, device in enumerate(reducer.devices):
        with tf.device(device):
            total = reducer.sum(local_stats, tower_index=i, name="bn1")
    reducer.check_consistent()  # once every tower (and its gradients) is built

Two transports carry the values (the ``transport`` argument):

  * 'collective': collective ops, one per tower and call, paired at run time
    by key, so each tower can be built alone. They run on the tower devices
    themselves (NCCL between GPUs): no statistics cross to a parameter
    device. The default when every tower is a GPU.
  * 'graph': one hub op per call on the first tower's device, fed by every
    tower through ordinary graph edges (towerlib.graph_exchange). On CPU
    devices an edge is a pointer hand-off where a collective is a ring of
    thread hand-offs, and a graph edge cannot wait for a tower that is not
    run. The default otherwise.

Either way, every tower's result is the same bits, and what follows about
pairing and checks holds; the run-time guards below only matter for
collectives.

The reductions are exact in both directions. Neither transport passes a
gradient by itself (collective ops have none registered; a hub ends in a
StopGradient), so each call is wrapped in a ``tf.custom_gradient`` whose
backward is itself a reduction with its own instance key:

  * ``sum``: y = sum_t x_t on every tower, so dL/dx_i = sum_t dL_t/dy_t: the
    backward is a sum of the incoming gradients.
  * ``gather``: y = [x_0; ...; x_{T-1}] on every tower, so dL/dx_i is row i of
    sum_t dL_t/dy_t: a sum followed by taking this tower's row.

A layer that writes its own backward calls ``sum(..., in_gradient=True)``
from its gradient function; such calls pair by the order tf.gradients builds
them. Off NCCL a small sum is an all-gather plus a local add (a ring
all-gather takes half the sequential steps of a ring all-reduce).

A collective waits for every member of its group. These keep a mistake
from becoming a silent hang:

  * at build time, every call is compared with the same call of the other
    towers (shapes, dtypes, kind), and ``check_consistent()`` compares the
    number of calls, naming the tower and the call that differ;
  * before a run, ``check_fetches(fetches)`` (or ``CollectiveFetchCheckHook``
    in a MonitoredSession) finds the collectives a ``session.run`` would
    execute and raises if some tower's half of one is missing, which is what
    fetching only tower 0's loss does;
  * at run time, a deadline bounds whatever is left: the Session's
    ``operation_timeout_in_ms`` (see ``bounded_session_config``) or
    RunOptions(timeout_in_ms); ``explain_collective_errors()`` turns the
    resulting error into a ``CollectiveTimeoutError`` that says what happened
    and what to do. Collective ops also take their own ``timeout_seconds``,
    but in TF 2.21 each such op starts a thread per step that sleeps for the
    whole timeout (measured: 336 collectives a step at a 300 s timeout pile
    up thousands of threads within a minute), so it is off by default;
  * with NCCL, each collective of a tower gets a control dependency on the
    tower's previous collective (in creation order), so every GPU launches
    them in the same order: NCCL kernels launched in different orders on
    different GPUs deadlock. Creation order is a topological order, so these
    edges never make a cycle. The CPU ring pairs ops by instance key and
    needs no order, so there the ops stay free to run as soon as they can.
"""

import contextlib
import dataclasses
import numbers
import threading
import weakref
from typing import List, Optional, Sequence, Tuple

import tensorflow as tf
from tensorflow.python.ops import collective_ops

from towerlib import graph_exchange

__all__ = [
    "DEFAULT_TIMEOUT_SECONDS",
    "CollectiveFetchCheckHook",
    "CollectiveMismatchError",
    "CollectiveTimeoutError",
    "CrossTowerReducer",
    "PartialFetchError",
    "bounded_session_config",
    "check_fetches",
    "explain_collective_errors",
]

# A session.run that takes longer than this fails instead of hanging, when
# the Session is configured by bounded_session_config. Generous on purpose: a
# tower may lag behind the others by a whole step on the first run (graph
# start-up, autotuning, input warm-up), and an expired deadline while the
# collectives are still forming their group aborts the Session's collectives.
DEFAULT_TIMEOUT_SECONDS = 300.0

# Off NCCL, a sum whose gathered copies (num_towers x size) stay under this
# many elements is computed as an all-gather plus a local sum: half the
# sequential ring steps of an all-reduce (see _CollectiveChannel.sum).
_GATHER_INSTEAD_OF_REDUCE_MAX_ELEMENTS = 1 << 16

# Keys start far from 0 so that towerlib's collectives do not collide with
# other users of collective ops in the same graph (tf.distribute starts at 1).
_GROUP_KEY_BASE = 0x7A0000
_INSTANCE_KEY_BASE = 0x7A0000
# Group keys at or above the base and below this are towerlib's own; a graph
# imported from a MetaGraphDef still shows them (its allocator is gone).
_GROUP_KEY_END = _GROUP_KEY_BASE + 0x10000

# Tower indices that a row tag of these dtypes represents exactly.
_EXACT_INTEGERS = {tf.float16: 2048, tf.bfloat16: 256}

TRANSPORTS = ("collective", "graph")


class CollectiveMismatchError(ValueError):
    """Towers of one reducer made different sequences of reductions.

    Raised while the graph is built: run, such a graph would wait forever (or
    until the timeout) for a partner call that does not exist, or, through
    the graph transport, fail for want of it.
    """


class CollectiveTimeoutError(tf.errors.DeadlineExceededError):
    """A cross-tower collective waited longer than its timeout for its peers."""

    def __init__(self, original, message):
        super().__init__(original.node_def, original.op, message)
        self.original = original


class _KeyAllocator:
    """Group and instance keys for the collectives of one graph.

    Kept per graph (see ``_allocator_for``) so that two reducers in one graph
    never share a key, while a new graph starts from the same keys as the last
    one: no counter leaks from one graph into the next.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._next_group_key = _GROUP_KEY_BASE
        self._next_instance_key = _INSTANCE_KEY_BASE
        self.used_group_keys = set()

    def new_group_key(self) -> int:
        with self._lock:
            while self._next_group_key in self.used_group_keys:
                self._next_group_key += 1
            key = self._next_group_key
            self.used_group_keys.add(key)
            self._next_group_key += 1
            return key

    def claim_group_key(self, key: int) -> None:
        with self._lock:
            if key in self.used_group_keys:
                raise ValueError(
                    f"group_key {key} is already used by another CrossTowerReducer in "
                    "this graph. Two reducers with one group key would pair each "
                    "other's collectives; pass group_key=None to get a fresh key."
                )
            self.used_group_keys.add(key)

    def new_instance_key(self) -> int:
        with self._lock:
            key = self._next_instance_key
            self._next_instance_key += 1
            return key


# Keyed by the graph object, held weakly: the allocator lives exactly as long
# as its graph. A graph collection would also work, but Saver.export_meta_graph
# tries to serialize every collection and warns about ones it cannot.
_ALLOCATORS = weakref.WeakKeyDictionary()
_ALLOCATORS_LOCK = threading.Lock()


def _allocator_for(graph: tf.Graph) -> _KeyAllocator:
    with _ALLOCATORS_LOCK:
        allocator = _ALLOCATORS.get(graph)
        if allocator is None:
            allocator = _KeyAllocator()
            _ALLOCATORS[graph] = allocator
        return allocator


@dataclasses.dataclass(frozen=True)
class _CallRecord:
    """What one tower asked for in one call; compared across towers."""

    kind: str  # 'sum' | 'gather', with '/backward' appended for gradients
    name: str
    shapes: Tuple[Tuple[Optional[int], ...], ...]
    dtype: str

    def describe(self) -> str:
        shapes = ", ".join(str(list(s)) for s in self.shapes)
        return f"{self.kind} '{self.name}' of {self.dtype} [{shapes}]"

    def conflicts_with(self, other: "_CallRecord") -> bool:
        # The name is the layer's variable scope, the same in every tower: two
        # same-shaped layers called in a different order must not pair up.
        if (self.kind, self.name, self.dtype, len(self.shapes)) != (
            other.kind,
            other.name,
            other.dtype,
            len(other.shapes),
        ):
            return True
        for mine, theirs in zip(self.shapes, other.shapes):
            if not tf.TensorShape(mine).is_compatible_with(tf.TensorShape(theirs)):
                return True
        return False


def _shape_tuple(tensor) -> Tuple[Optional[int], ...]:
    if tensor.shape.rank is None:
        raise ValueError(
            f"Cannot reduce {tensor.name} across towers: its rank is unknown. "
            "Give it a static rank (tf.ensure_shape / set_shape)."
        )
    return tuple(tensor.shape.as_list())


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
        edges: towerlib.graph_exchange). None picks 'collective' when every
        device is a GPU, for NCCL, and 'graph' otherwise: on CPU devices it
        is far cheaper than a collective ring and cannot hang. The
        arguments above only concern the 'collective' transport.

    With one device nothing is exchanged: ``sum`` is the identity and
    ``gather`` adds a leading axis of size 1.
    """

    def __init__(
        self,
        devices: Sequence[str],
        group_key: Optional[int] = None,
        timeout_seconds: Optional[float] = None,
        communication_hint: Optional[str] = None,
        ordered: Optional[bool] = None,
        transport: Optional[str] = None,
    ):
        devices = list(devices)
        if not devices:
            raise ValueError("CrossTowerReducer needs at least one device; got none.")
        canonical = [tf.DeviceSpec.from_string(d).to_string() for d in devices]
        if len(set(canonical)) != len(canonical):
            raise ValueError(
                f"CrossTowerReducer devices must be distinct (one per tower), got "
                f"{devices}: a collective needs each member on its own device."
            )
        if timeout_seconds is not None and not timeout_seconds > 0:
            raise ValueError(
                f"timeout_seconds must be None (no per-op timeout) or a positive "
                f"number of seconds, got {timeout_seconds!r}."
            )
        all_gpus = {tf.DeviceSpec.from_string(d).device_type for d in devices} == {"GPU"}
        if transport is None:
            transport = "collective" if all_gpus else "graph"
        if transport not in TRANSPORTS:
            raise ValueError(
                f"transport must be one of {TRANSPORTS} (or None to choose by "
                f"device type), got {transport!r}."
            )
        if group_key is not None and transport != "collective":
            raise ValueError(
                "group_key is a collective group key, and this reducer uses the "
                f"{transport!r} transport; pass transport='collective' with it."
            )
        if communication_hint is None:
            communication_hint = "nccl" if all_gpus else "auto"
        if communication_hint not in ("auto", "ring", "nccl"):
            raise ValueError(
                f"communication_hint must be 'auto', 'ring' or 'nccl', got {communication_hint!r}."
            )

        self._graph = tf.compat.v1.get_default_graph()
        self._keys = _allocator_for(self._graph)
        self._transport = transport
        if len(devices) > 1 and transport == "collective":
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
            self._channel = graph_exchange.GraphExchange(devices)
        else:
            self._channel = _CollectiveChannel(
                devices, group_key, communication_hint, self._timeout_seconds, self._ordered)

        self._lock = threading.Lock()
        # Per tower, the forward calls and the backward calls, in creation order.
        self._forward_calls: List[List[_CallRecord]] = [[] for _ in devices]
        self._backward_calls: List[List[_CallRecord]] = [[] for _ in devices]
        # Which tower first made forward call k / backward call k (the reference).
        self._forward_reference: List[int] = []
        self._backward_reference: List[int] = []
        # Instance keys: forward call k -> key; backward call k -> key.
        self._forward_keys: List[int] = []
        self._backward_keys: List[int] = []

    @property
    def devices(self) -> List[str]:
        return list(self._devices)

    @property
    def num_towers(self) -> int:
        return len(self._devices)

    @property
    def transport(self) -> str:
        """'collective' or 'graph' (see the constructor)."""
        return self._transport

    @property
    def group_key(self) -> Optional[int]:
        """The collective group key; None for one tower or the graph transport."""
        return self._group_key

    @property
    def timeout_seconds(self) -> Optional[float]:
        """The per-op collective timeout, or None when there is none."""
        return self._timeout_seconds

    @property
    def communication_hint(self) -> str:
        return self._communication_hint

    @property
    def ordered(self) -> bool:
        """Whether each tower's collectives are chained in creation order."""
        return self._ordered

    def num_calls(self, tower_index: int) -> int:
        """Forward reductions tower `tower_index` has built so far."""
        return len(self._forward_calls[tower_index])

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
          (on this tower's device through collectives; through the graph
          transport, the one hub's output, on devices[0]). Differentiable:
          the gradient is the sum of all towers' incoming gradients (exact
          data-parallel gradient).
        """
        return self._reduce("sum", tensors, tower_index, name, in_gradient, differentiable)

    def gather(self, tensors, tower_index: int, name: Optional[str] = None):
        """Every tower's `tensors`, stacked along a new leading tower axis.

        Args:
          tensors: a tensor or a list of tensors of one dtype, with the same shape
            in every tower (one exchange for the whole list).
          tower_index: which tower is calling.
          name: names the call in errors and in the graph.

        Returns:
          The same structure as `tensors`: a tensor of shape
          [num_towers, *shape] whose row t is tower t's value. Differentiable:
          the gradient for this tower's input is row `tower_index` of the sum of
          all towers' incoming gradients.

        Use it instead of ``sum`` when the combination must see each tower's
        value, e.g. combining per-tower means and variances without cancellation.

        Row order. The graph transport's hub stacks rows in tower order. An
        all-gather stacks them in the collective's rank order, which
        TensorFlow chooses: sorted device names on CPU, an order that follows
        the interconnect on GPUs. So through collectives each row travels
        with its tower index and the rows are put back in tower order: a
        handful of small ops, and on GPUs a trip to host memory for the
        permutation (TensorFlow's InvertPermutation runs there).
        ``gather_unordered`` skips all that, for combinations that do not
        care about the order.
        """
        return self._reduce("gather", tensors, tower_index, name)

    def gather_unordered(self, tensors, tower_index: int, name: Optional[str] = None):
        """Like ``gather``, with rows in the transport's order.

        That is the collective's rank order, or tower order through the graph
        transport.

        The order is the same on every tower, so a combination computed from
        the rows (a sum over them, say) comes out bit for bit the same on
        every tower; but row t need not be tower t's. Not differentiable: for
        callers whose own tf.custom_gradient covers the call, like
        batch_norm's synchronized statistics.
        """
        return self._reduce("gather_unordered", tensors, tower_index, name)

    def check_consistent(self) -> None:
        """Raises CollectiveMismatchError unless all towers made the same calls.

        Call it once every tower has been built, including its gradients (the
        backward exchanges are built by tf.gradients and are checked too).
        Per-call shapes and dtypes are already checked as the calls are made;
        this adds the check only possible at the end: the number of calls.
        """
        self._check_counts("forward")
        self._check_counts("backward")

    def _check_counts(self, direction):
        calls = self._forward_calls if direction == "forward" else self._backward_calls
        counts = [len(c) for c in calls]
        if len(set(counts)) <= 1:
            return
        fewest, most = min(counts), max(counts)
        short_tower = counts.index(fewest)
        long_tower = counts.index(most)
        first_missing = calls[long_tower][fewest]
        raise CollectiveMismatchError(
            f"Towers made different numbers of {direction} cross-tower "
            "reductions: "
            + ", ".join(f"tower {t}: {n}" for t, n in enumerate(counts))
            + f". Tower {short_tower} never made reduction #{fewest} "
            f"({first_missing.describe()}, made by tower {long_tower}), so that "
            "reduction could never complete (a collective would wait for it until a "
            "deadline). Every tower must "
            "call the synchronized layers (e.g. batch_norm with "
            "bn_mode='sync') the same number of times in the same order; do not "
            "make them depend on ctx.index or ctx.is_first."
        )

    # -------------------------------------------------------------- internals

    def _check_tower(self, tower_index):
        if (
            isinstance(tower_index, bool)
            or not isinstance(tower_index, numbers.Integral)
            or not (0 <= tower_index < len(self._devices))
        ):
            raise ValueError(
                f"tower_index must be an int in [0, {len(self._devices)}), got {tower_index!r}."
            )
        graph = tf.compat.v1.get_default_graph()
        if graph is not self._graph:
            raise ValueError(
                "CrossTowerReducer used in a different graph than the one it was "
                "created in (or inside a tf.function / control-flow body). Create "
                "the reducer in the graph that holds the towers, and call it "
                "directly in that graph."
            )

    def _record(self, direction: str, tower_index: int, record: _CallRecord) -> int:
        """Appends `record` to the tower's calls; returns the call's index.

        Compares it with the same call of the tower that made it first and
        raises CollectiveMismatchError at once if they differ.
        """
        if direction == "forward":
            calls, reference, keys = (
                self._forward_calls,
                self._forward_reference,
                self._forward_keys,
            )
        else:
            calls, reference, keys = (
                self._backward_calls,
                self._backward_reference,
                self._backward_keys,
            )
        with self._lock:
            index = len(calls[tower_index])
            if index < len(reference):
                ref_tower = reference[index]
                ref = calls[ref_tower][index]
                if record.conflicts_with(ref):
                    raise CollectiveMismatchError(
                        f"Cross-tower {direction} reduction #{index} differs between "
                        f"towers: tower {ref_tower} made {ref.describe()} but tower "
                        f"{tower_index} made {record.describe()}. They would be "
                        "paired and fail or wait forever. Every tower must "
                        "call the synchronized layers in the same order with the same "
                        "shapes (same layers, same channels)."
                    )
            else:
                reference.append(tower_index)
                keys.append(self._keys.new_instance_key())
            calls[tower_index].append(record)
            return index

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
        record = _CallRecord(
            kind + ("/backward" if in_gradient else ""),
            name,
            tuple(_shape_tuple(t) for t in flat),
            flat[0].dtype.name,
        )
        call_index = self._record(direction, tower_index, record)
        keys = self._backward_keys if in_gradient else self._forward_keys
        instance_key = keys[call_index]

        with tf.name_scope(f"{_scope_name(name)}_cross_tower_{kind}"):
            if len(self._devices) == 1:
                result = flat if kind == "sum" else [t[tf.newaxis] for t in flat]
                return result[0] if single else result
            with tf.device(self._devices[tower_index]):
                packed, unpack = _pack(flat)
                if kind == "sum":
                    if differentiable:
                        reduced = self._differentiable_sum(packed, tower_index, instance_key, name)
                    else:
                        reduced = self._channel.sum(
                            packed, tower_index, instance_key,
                            name + "/backward" if in_gradient else name)
                    result = unpack(reduced, leading=[])
                else:
                    row = packed[tf.newaxis]
                    if kind == "gather":
                        gathered = self._gather_in_tower_order(row, tower_index, instance_key, name)
                    else:
                        gathered = self._channel.gather(row, tower_index, instance_key, name)
                    result = unpack(gathered, leading=[len(self._devices)])
        return result[0] if single else result

    def _backward_key(self, kind, tower_index, name, grad):
        record = _CallRecord(kind + "/backward", name, (_shape_tuple(grad),), grad.dtype.name)
        index = self._record("backward", tower_index, record)
        return self._backward_keys[index]

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
        if exact_up_to is not None and len(self._devices) > exact_up_to:
            raise ValueError(
                f"CrossTowerReducer.gather ({name}) tags each row with its tower "
                f"index in the rows' dtype, and {row.dtype.name} holds integers "
                f"exactly only up to {exact_up_to}; this reducer has "
                f"{len(self._devices)} towers. Cast the tensors to float32 first."
            )

        @tf.custom_gradient
        def cross_tower_gather(x):
            tagged = tf.concat([tf.constant([[tower_index]], x.dtype), x], axis=1)
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

        def grad(upstream):  # [num_towers, K] in tower order
            key = self._backward_key("gather", tower_index, name, upstream)
            total = self._channel.sum(upstream, tower_index, key, name + "/backward")
            return total[tower_index : tower_index + 1]

        return grad


class _CollectiveChannel:
    """Moves a reducer's values with collective ops, one per tower and call.

    Each op runs on its tower's device, all with the reducer's group key and
    the call's instance key. Rows of a gather come in the collective's rank
    order (see CrossTowerReducer.gather).
    """

    rows_in_tower_order = False

    def __init__(self, devices, group_key, communication_hint, timeout_seconds, ordered):
        self._devices = devices
        self._group_key = group_key
        self._communication_hint = communication_hint
        self._timeout_seconds = timeout_seconds
        self._ordered = ordered
        # Per tower, the last collective op built, to chain the next one after
        # it (when ordered).
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
            and size * len(self._devices) <= _GATHER_INSTEAD_OF_REDUCE_MAX_ELEMENTS
        ):
            gathered = self.gather(tensor[tf.newaxis], tower_index, instance_key, name)
            with tf.device(self._devices[tower_index]):
                return tf.reduce_sum(gathered, axis=0)
        with tf.device(self._devices[tower_index]):
            with tf.control_dependencies(self._order_after(tower_index)):
                out = collective_ops.all_reduce(
                    tensor,
                    len(self._devices),
                    self._group_key,
                    instance_key,
                    merge_op="Add",
                    final_op="Id",
                    communication_hint=self._communication_hint,
                    timeout=self._timeout_seconds or 0,
                )
        self._last_collective[tower_index] = out.op
        return out

    def gather(self, tensor, tower_index, instance_key, name):
        """One all-gather op (along axis 0) on this tower's device."""
        del name  # the caller's name scope names the op
        with tf.device(self._devices[tower_index]):
            with tf.control_dependencies(self._order_after(tower_index)):
                out = collective_ops.all_gather(
                    tensor,
                    len(self._devices),
                    self._group_key,
                    instance_key,
                    communication_hint=self._communication_hint,
                    timeout=self._timeout_seconds or 0,
                )
        self._last_collective[tower_index] = out.op
        out.set_shape([len(self._devices)] + tensor.shape.as_list()[1:])
        return out

    def _order_after(self, tower_index):
        """Control inputs that keep this tower's collectives in creation order."""
        previous = self._last_collective[tower_index]
        if not self._ordered or previous is None:
            return []
        return [previous]


def _pack(flat):
    """One flat vector from same-dtype tensors, and the function undoing it.

    Returns (packed, unpack): packed is the tensors flattened and concatenated
    ([K]); unpack(result, leading) splits a [*leading, K] result back into
    tensors of shape [*leading, *shape_i]. Static shapes give static splits
    and reshapes (no shape ops in the step); unknown ones fall back to
    tf.shape / tf.size at run time.
    """
    if all(t.shape.is_fully_defined() for t in flat):
        shapes = [t.shape.as_list() for t in flat]
        sizes = [t.shape.num_elements() for t in flat]
    else:
        shapes = [tf.shape(t) for t in flat]
        sizes = [tf.size(t) for t in flat]
    if len(flat) == 1 and flat[0].shape.rank == 1:
        packed = flat[0]
    else:
        packed = tf.concat([tf.reshape(t, [-1]) for t in flat], axis=0)

    def unpack(result, leading):
        axis = len(leading)
        pieces = [result] if len(flat) == 1 else tf.split(result, sizes, axis=axis, num=len(flat))
        unpacked = []
        for piece, shape, tensor in zip(pieces, shapes, flat):
            if isinstance(shape, list):
                target = leading + shape
            else:
                target = tf.concat([tf.constant(leading, tf.int32), shape], axis=0)
            if tensor.shape.rank != 1 or not isinstance(shape, list):
                piece = tf.reshape(piece, target)
            piece.set_shape(leading + tensor.shape.as_list())
            unpacked.append(piece)
        return unpacked

    return packed, unpack


def _scope_name(name: str) -> str:
    """A name usable as a name scope (no '/' nesting, no ':')."""
    return name.replace("/", "_").replace(":", "_")


_COLLECTIVE_OP_TYPES = frozenset(
    ["CollectiveReduce", "CollectiveGather", "CollectiveReduceV2", "CollectiveGatherV2"]
)


class PartialFetchError(ValueError):
    """A session.run would run only some towers' halves of a collective."""


def _graph_elements(fetches, graph):
    elements = []
    for fetch in tf.nest.flatten(fetches, expand_composites=True):
        if fetch is None:
            continue
        try:
            elements.append(graph.as_graph_element(fetch, allow_tensor=True, allow_operation=True))
        except (TypeError, ValueError):
            continue  # not a graph element of this graph: session.run will say so
    return elements


def check_fetches(fetches, feed_dict=None, graph=None) -> None:
    """Raises PartialFetchError if running `fetches` would hang on a collective.

    Walks the part of the graph that ``session.run(fetches, feed_dict)`` would
    execute (data and control inputs, stopping at fed tensors) and groups the
    collective ops it meets by (group key, instance key). A collective of a
    group of T towers completes only when all T of its ops run; if the run
    holds fewer, it would wait forever (or until a deadline). The typical
    cause is fetching one tower's tensors alone, e.g. ``train.tower_losses[0]``.

    Cost: one walk over the fetched subgraph (milliseconds for a ResNet on 8
    towers); ``CollectiveFetchCheckHook`` caches the answer per fetch set.

    Args:
      fetches: what would be passed to session.run (a nest of tensors,
        operations, variables or their names).
      feed_dict: its feeds; fed tensors cut the walk.
      graph: the graph (default: the default graph).
    """
    graph = graph if graph is not None else tf.compat.v1.get_default_graph()
    fed = {id(t) for t in _graph_elements(list(feed_dict or {}), graph)}
    stack = []
    for element in _graph_elements(fetches, graph):
        if id(element) in fed:
            continue
        stack.append(element.op if isinstance(element, tf.Tensor) else element)
    seen, members = set(), {}
    while stack:
        op = stack.pop()
        if id(op) in seen:
            continue
        seen.add(id(op))
        if op.type in _COLLECTIVE_OP_TYPES and "group_key" in op.node_def.attr:
            key = (op.get_attr("group_key"), op.get_attr("instance_key"))
            members.setdefault(key, []).append(op)
        for tensor in op.inputs:
            if id(tensor) not in fed:
                stack.append(tensor.op)
        stack.extend(op.control_inputs)
    for (group_key, instance_key), ops in sorted(members.items()):
        group_size = ops[0].get_attr("group_size")
        if len(ops) < group_size:
            names = sorted(op.name for op in ops)
            raise PartialFetchError(
                f"This session.run would run {len(ops)} of the {group_size} ops of "
                f"a cross-tower collective (group {group_key}, instance "
                f"{instance_key}): {names}. A collective completes only when every "
                "tower's op runs in the same session.run, so this run would wait "
                "for the missing towers forever. The fetches need only some "
                "towers (e.g. tower 0's loss or outputs alone): fetch the train "
                "op, or tensors of every tower (TrainGraph.loss needs them all); "
                "for per-tower inspection build an evaluation graph "
                "(build_towers with is_training=False), which has no collectives."
            )


class CollectiveFetchCheckHook(tf.compat.v1.train.SessionRunHook):
    """Runs `check_fetches` before each run of a MonitoredSession.

    The check runs once per distinct (fetches, feeds) signature, so a
    training loop pays for it on its first step only. Fetches that other
    hooks add are not checked.
    """

    def __init__(self):
        self._checked = set()

    def before_run(self, run_context):
        args = run_context.original_args
        graph = run_context.session.graph
        signature = (
            tuple(_signature(e) for e in _graph_elements(args.fetches, graph)),
            tuple(
                sorted(_signature(e) for e in _graph_elements(list(args.feed_dict or {}), graph))
            ),
        )
        if signature not in self._checked:
            check_fetches(args.fetches, args.feed_dict, graph)
            self._checked.add(signature)


def _signature(element):
    return element.name


def bounded_session_config(config=None, timeout_seconds=DEFAULT_TIMEOUT_SECONDS):
    """A copy of `config` whose session.run calls fail after `timeout_seconds`.

    Sets ConfigProto.operation_timeout_in_ms, the Session's default deadline
    for every run (RunOptions.timeout_in_ms overrides it per run). Unlike the
    collectives' own timeout, it costs no thread. It bounds whole steps, not
    just collectives, so keep it well above the slowest legitimate step
    (the first one included).

    Args:
      config: a tf.compat.v1.ConfigProto, e.g. towerlib.session_config(n);
        None starts from an empty one.
      timeout_seconds: the deadline of one session.run.
    """
    if not timeout_seconds > 0:
        raise ValueError(f"timeout_seconds must be positive, got {timeout_seconds!r}.")
    bounded = tf.compat.v1.ConfigProto()
    if config is not None:
        bounded.CopyFrom(config)
    bounded.operation_timeout_in_ms = int(timeout_seconds * 1000)
    return bounded


_TIMEOUT_MARKERS = ("Collective has timed out", "Collective ops is aborted")
# What Session.run reports when its deadline (RunOptions.timeout_in_ms or
# ConfigProto.operation_timeout_in_ms) expires: it does not say which op was
# still running.
_RUN_DEADLINE_MARKER = "Timed out waiting for notification"


def has_towerlib_collectives(graph) -> bool:
    """Whether `graph` holds collectives of a CrossTowerReducer (bn_mode='sync').

    Recognized by group key, not by op name, so other collectives in the
    graph do not count: the keys this graph's reducers were given, and, for a
    graph imported from a MetaGraphDef, keys in the range towerlib allocates
    from.
    """
    with _ALLOCATORS_LOCK:
        allocator = _ALLOCATORS.get(graph)
    claimed = set(allocator.used_group_keys) if allocator is not None else set()

    def is_towerlib_key(key):
        return key in claimed or _GROUP_KEY_BASE <= key < _GROUP_KEY_END

    return any(
        op.type in _COLLECTIVE_OP_TYPES
        and "group_key" in op.node_def.attr
        and is_towerlib_key(op.get_attr("group_key"))
        for op in graph.get_operations()
    )


@contextlib.contextmanager
def explain_collective_errors(graph: Optional[tf.Graph] = None):
    """Re-raises a collective timeout from session.run with an explanation.

        with explain_collective_errors():
          session.run(train_op)

    A DeadlineExceededError (or CancelledError) raised by a collective op
    becomes a CollectiveTimeoutError whose message names the op that waited,
    the likely causes and the fix. So does an expired run deadline
    (RunOptions.timeout_in_ms, ConfigProto.operation_timeout_in_ms) when
    `graph` (default: the default graph at entry) holds towerlib collectives,
    since that error does not name the op still running. Other errors pass
    through unchanged.
    """
    graph = graph if graph is not None else tf.compat.v1.get_default_graph()
    try:
        yield
    except (tf.errors.DeadlineExceededError, tf.errors.CancelledError) as error:
        text = error.message or ""
        if isinstance(error, CollectiveTimeoutError):
            raise
        if any(marker in text for marker in _TIMEOUT_MARKERS):
            node = error.op.name if error.op is not None else "a collective op"
            opening = (
                f"Cross-tower collective {node} did not complete: it waited "
                "for the other towers longer than its timeout."
            )
        elif _RUN_DEADLINE_MARKER in text and has_towerlib_collectives(graph):
            opening = (
                "session.run hit its deadline (RunOptions.timeout_in_ms or "
                "ConfigProto.operation_timeout_in_ms) in a graph with "
                "cross-tower collectives; most likely a "
                "collective was waiting for towers that this run never "
                "started."
            )
        else:
            raise
        message = opening + (
            " Every tower's collectives must run in the same session.run. Likely "
            "causes: (1) the fetches need only some towers (e.g. tower 0's loss "
            "or outputs alone): fetch the train op, or tensors of every tower "
            "(towerlib.collective.check_fetches finds this before running); "
            "(2) the towers built different sequences of synchronized layers "
            "(call CrossTowerReducer.check_consistent() after building them); (3) "
            "one tower is stalled, e.g. waiting on its input: raise the "
            "deadline if it is just slow. After such a timeout the "
            "Session's collectives may stay aborted (every later run fails with "
            '"Collective ops is aborted"): create a new Session.'
        )
        cause = next(
            (
                line.strip()
                for line in text.splitlines()
                if any(m in line for m in _TIMEOUT_MARKERS + (_RUN_DEADLINE_MARKER,))
            ),
            "",
        )
        message += f"\nOriginal error: {cause}"
        raise CollectiveTimeoutError(error, message) from error

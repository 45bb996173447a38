"""Is the tower loop serial or parallel? One traced step's answer, in numbers.

    md = tf.compat.v1.RunMetadata()
    sess.run(train.train_op, run_metadata=md, options=tf.compat.v1.RunOptions(
        trace_level=tf.compat.v1.RunOptions.FULL_TRACE))
    profile = towerlib.trace.analyze_step(md, train.devices, step=21)
    print(profile.summary_line())
    # traced step 21: 4 towers, 183 ms; towers overlap 71% of the step (2.9
    # computing at once on average); exchange 12 ms (7%), aggregation+apply
    # 9 ms (5%), input 1 ms; 3 ops (0.2 ms) not attributed

Only the step's own `step_stats` is read: each op execution is an interval
[all_start_micros, all_start_micros + all_end_rel_micros) of integer
microseconds on a device (towerlib.trace.lanes: GPU stream lanes counted
once), with a phase (towerlib.trace.phases) and, when it can be told, a
tower. All times are integer microseconds and exact; an op shorter than a
microsecond counts as an op but covers no time.

Towers. An op belongs to tower i when its name is in tower i's scope
('tower_i/', 'micro_batch_j/tower_i/', 'replicated/tower_i/',
'allreduce_tower_i/', ...); otherwise to the tower whose device it ran on,
when exactly one tower has that device; otherwise to none ("not
attributed": e.g. the host CPU's ops when the towers are GPUs).
"""

import dataclasses
import types
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from towerlib.trace import intervals, lanes, phases

__all__ = ["DeviceProfile", "StepOp", "StepProfile", "TowerProfile", "analyze_step"]

_NAMES_KEPT = 10


@dataclasses.dataclass(frozen=True)
class StepOp:
    """An op execution of the step with its phase and tower (None: not attributed)."""

    event: lanes.OpEvent
    phase: str
    tower: Optional[int]


@dataclasses.dataclass(frozen=True)
class TowerProfile:
    """One tower in the traced step.

    Attributes:
      index: the tower's index (its 'tower_<index>' scope).
      device: the device it ran on.
      busy_micros: the union of its ops' intervals, every phase.
      compute_micros: the union of its 'compute' ops' intervals (forward and
        backward): the time it was computing, used for the overlap.
      op_count: its op executions.
      share: busy_micros / the step's span (0 for an empty step).
    """

    index: int
    device: str
    busy_micros: int
    compute_micros: int
    op_count: int
    share: float


@dataclasses.dataclass(frozen=True)
class DeviceProfile:
    """One device in the traced step: busy_micros is the union of all its ops."""

    device: str
    busy_micros: int
    op_count: int
    towers: Tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class StepProfile:
    """A traced step, from its first op's start to its last op's end.

    Attributes:
      step: the step's number, when the caller gave it (for summary_line).
      start_micros: the first op's start, microseconds since the epoch.
      span_micros: the step's wall span, first start to last end of any op
        recorded (a GPU's kernel launches included).
      towers: per tower, in index order.
      devices: per device, in the trace's order.
      overlap_micros: the time during which 2 or more towers were computing
        (had a 'compute' op running).
      computing_micros: the time during which at least 1 tower was computing.
      tower_compute_micros: the integral over the step of the number of towers
        computing, i.e. the sum of the towers' compute_micros.
      phase_micros: {phase: union of that phase's intervals over all
        devices}: wall time during which the phase ran somewhere, comparable
        to the span; phases overlap each other, so these add up to more
        than busy_micros when work runs side by side.
      phase_device_sum_micros: {phase: sum over devices of that device's
        union}: device time (4 towers computing for 1 ms at once give 4 ms).
      phase_partition_micros: {phase: the time it is the highest-priority
        running phase (phases.PRIORITY: exchange > apply > input > compute
        > other)}: a partition of busy_micros, so these plus idle_micros are
        exactly span_micros.
      busy_micros: the union of all ops' intervals.
      idle_micros: span_micros - busy_micros: no op of the step running.
      op_count: the op executions analysed (each once, lanes.device_events).
      unattributed_count / unattributed_micros: the ops of no tower, and the
        union of their intervals.
      unattributed_names: up to 10 of their names, longest-running first.
      ops: every op execution analysed, in time order.
    """

    step: Optional[int]
    start_micros: int
    span_micros: int
    towers: Tuple[TowerProfile, ...]
    devices: Tuple[DeviceProfile, ...]
    overlap_micros: int
    computing_micros: int
    tower_compute_micros: int
    phase_micros: Mapping[str, int]
    phase_device_sum_micros: Mapping[str, int]
    phase_partition_micros: Mapping[str, int]
    busy_micros: int
    idle_micros: int
    op_count: int
    unattributed_count: int
    unattributed_micros: int
    unattributed_names: Tuple[str, ...]
    ops: Tuple[StepOp, ...] = dataclasses.field(repr=False, compare=False)

    @property
    def overlap_fraction(self) -> float:
        """The fraction of the span during which 2 or more towers computed (0..1)."""
        return self.overlap_micros / self.span_micros if self.span_micros else 0.0

    @property
    def mean_towers_computing(self) -> float:
        """How many towers computed at once on average, over the time any did.

        The integral of n(t), the number of towers with a 'compute' op
        running at t, divided by the time n(t) >= 1: 1.0 for towers that
        take turns, the tower count when all compute side by side all the
        time. 0 when no tower computed.
        """
        if not self.computing_micros:
            return 0.0
        return self.tower_compute_micros / self.computing_micros

    def tower_of(self, name: str, device: str) -> Optional[int]:
        """The tower an op `name` run on `device` belongs to, by the rule above."""
        return _tower_for(name, device, {t.index: t.device for t in self.towers})

    def summary_line(self) -> str:
        """One line: towers, span, overlap, exchange, apply, input, not attributed."""
        phase = self.phase_micros
        span = self.span_micros

        def percent(micros):
            return f"{100 * micros / span:.0f}%" if span else "0%"

        label = "traced step" + (f" {self.step}" if self.step is not None else "")
        return (
            f"{label}: {len(self.towers)} towers, {_ms(span)}; towers overlap "
            f"{percent(self.overlap_micros)} of the step "
            f"({self.mean_towers_computing:.1f} computing at once on average); "
            f"exchange {_ms(phase[phases.EXCHANGE])} ({percent(phase[phases.EXCHANGE])}), "
            f"aggregation+apply {_ms(phase[phases.APPLY])} "
            f"({percent(phase[phases.APPLY])}), input {_ms(phase[phases.INPUT])}; "
            f"{self.unattributed_count} ops ({_ms(self.unattributed_micros)}) "
            "not attributed")


def _ms(micros: int) -> str:
    """183 ms, 5.4 ms, 0.015 ms: whole milliseconds from 10 ms, else 3 digits."""
    value = micros / 1000
    return f"{value:.0f} ms" if value >= 10 else f"{value:.3g} ms"


def _tower_devices(given, events_by_device) -> Dict[int, str]:
    """{tower index: device name in the trace (or as given when absent)}."""
    if given is not None:
        found = {}
        keys = {device: lanes.parse_device(device) for device in events_by_device}
        for index, device in enumerate(given):
            wanted = lanes.parse_device(device)
            same = [name for name, key in keys.items()
                    if name == device or (wanted and key and wanted.matches(key))]
            found[index] = same[0] if same else device
        return found
    counts: Dict[int, Dict[str, List[int]]] = {}
    for device, events in events_by_device.items():
        for event in events:
            index = phases.tower_index(event.name)
            if index is not None:
                tally = counts.setdefault(index, {}).setdefault(device, [0, 0])
                tally[0] += phases.classify(event.name, event.op_type) == phases.COMPUTE
                tally[1] += 1
    order = list(events_by_device)
    return {index: max(order, key=lambda d: tuple(tallies.get(d, (0, 0))))
            for index, tallies in sorted(counts.items())}


def _tower_for(name: str, device: str, tower_device: Mapping[int, str]) -> Optional[int]:
    """The tower of op `name` run on `device`: by scope, else by device, else None."""
    tower = phases.tower_index(name)
    if tower in tower_device:
        return tower
    on_device = [index for index, where in tower_device.items() if where == device]
    return on_device[0] if len(on_device) == 1 else None


def _attribute(events_by_device, tower_device) -> List[StepOp]:
    ops = [StepOp(event, phases.classify(event.name, event.op_type),
                  _tower_for(event.name, event.device, tower_device))
           for events in events_by_device.values() for event in events]
    ops.sort(key=lambda op: (op.event.start, op.event.end, op.event.device, op.event.name))
    return ops


def _spans(ops: Sequence[StepOp]):
    return [(op.event.start, op.event.end) for op in ops]


def _tower_profiles(ops, tower_device, span):
    """(TowerProfiles in index order, {tower index: its compute intervals})."""
    own: Dict[int, List[StepOp]] = {index: [] for index in tower_device}
    for op in ops:
        if op.tower is not None:
            own[op.tower].append(op)
    towers, computing = [], {}
    for index, device in sorted(tower_device.items()):
        computing[index] = _spans([op for op in own[index] if op.phase == phases.COMPUTE])
        busy = intervals.length(_spans(own[index]))
        towers.append(TowerProfile(index, device, busy, intervals.length(computing[index]),
                                   len(own[index]), busy / span if span else 0.0))
    return tuple(towers), computing


def _phase_times(ops):
    """({phase: union}, {phase: per-device sum}, {phase: partition}) in microseconds."""
    spans = {phase: [] for phase in phases.PHASES}
    by_device: Dict[Tuple[str, str], List[Tuple[int, int]]] = {}
    for op in ops:
        interval = (op.event.start, op.event.end)
        spans[op.phase].append(interval)
        by_device.setdefault((op.phase, op.event.device), []).append(interval)
    device_sum = {phase: 0 for phase in phases.PHASES}
    for (phase, _), members in by_device.items():
        device_sum[phase] += intervals.length(members)
    return ({phase: intervals.length(members) for phase, members in spans.items()},
            device_sum, intervals.partition(spans, phases.PRIORITY))


def analyze_step(run_metadata_or_step_stats, tower_devices: Optional[Sequence[str]] = None,
                 *, step: Optional[int] = None) -> StepProfile:
    """The StepProfile of one traced step.

    Args:
      run_metadata_or_step_stats: a tf.compat.v1.RunMetadata filled by a
        FULL_TRACE run, or its `step_stats`.
      tower_devices: the towers' devices in tower order (TrainGraph.devices),
        tower i being tower_devices[i]; short forms like '/gpu:0' match the
        trace's full names. None: found from the trace, tower i on the
        device that ran most of tower i's compute ops.
      step: the step's number, only for summary_line.
    """
    step_stats = lanes.step_stats_of(run_metadata_or_step_stats)
    events_by_device = lanes.device_events(step_stats)
    tower_device = _tower_devices(tower_devices, events_by_device)
    ops = _attribute(events_by_device, tower_device)
    # The span covers every op recorded, a GPU's launches included
    # ('/host:CPU' lanes only repeat the others).
    recorded = [e for lane, events in lanes.lane_events(step_stats).items()
                if not lane.startswith("/host:") for e in events]
    start = min((e.start for e in recorded), default=0)
    span = max((e.end for e in recorded), default=0) - start

    towers, computing = _tower_profiles(ops, tower_device, span)
    pieces = intervals.coverage_counts(computing)
    devices = tuple(
        DeviceProfile(device, intervals.length((e.start, e.end) for e in events),
                      len(events),
                      tuple(i for i, d in sorted(tower_device.items()) if d == device))
        for device, events in events_by_device.items())
    union, device_sum, partition = _phase_times(ops)
    busy = intervals.length(_spans(ops))
    unattributed = [op for op in ops if op.tower is None]
    longest = sorted(unattributed, key=lambda op: (-op.event.duration, op.event.name))
    return StepProfile(
        step=step, start_micros=start, span_micros=span, towers=towers, devices=devices,
        overlap_micros=sum(end - begin for begin, end, active in pieces if len(active) > 1),
        computing_micros=sum(end - begin for begin, end, _ in pieces),
        tower_compute_micros=sum((end - begin) * len(active) for begin, end, active in pieces),
        phase_micros=types.MappingProxyType(union),
        phase_device_sum_micros=types.MappingProxyType(device_sum),
        phase_partition_micros=types.MappingProxyType(partition),
        busy_micros=busy, idle_micros=span - busy, op_count=len(ops),
        unattributed_count=len(unattributed),
        unattributed_micros=intervals.length(_spans(unattributed)),
        unattributed_names=tuple(dict.fromkeys(op.event.name for op in longest))[:_NAMES_KEPT],
        ops=tuple(ops))

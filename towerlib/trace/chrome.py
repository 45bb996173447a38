"""A traced step as a Chrome trace: open it in chrome://tracing or ui.perfetto.dev.

    write_chrome_trace(run_metadata, "trace_step_21.json", profile=profile)

The file is the Trace Event Format's JSON object form:

    {"traceEvents": [
        {"ph": "M", "name": "process_name", "pid": 0,
         "args": {"name": "tower 0 (/job:localhost/replica:0/task:0/device:CPU:0)"}},
        {"ph": "X", "name": "Conv2D", "cat": "compute", "pid": 0, "tid": 0,
         "ts": 105, "dur": 40, "args": {"name": "tower_0/conv1/Conv2D",
         "op": "Conv2D", "phase": "compute", "tower": 0}},
        ...],
     "displayTimeUnit": "ms", "otherData": {"summary": "traced step 21: ..."}}

One process (pid) per lane of the trace (`step_stats.dev_stats`, GPU stream
and memcpy lanes included): the towers' lanes first, in tower order, each named
'tower i (<its device string>)', then the others in the trace's order.
An op is a complete event ('X') named by its op type (its node name when
the trace gives no type); ts and dur are microseconds, ts counted from the
step's first op. Ops that run at the same time on one device (CPU
inter-op threads, GPU streams) would nest wrongly on one thread, so each
lane's ops are packed onto rows ('tid' 0, 1, ...): an op goes to the first
row free when it starts.
"""

import json
from typing import Dict, List, Optional, Sequence

from towerlib.trace import analysis, atomic, lanes, phases

__all__ = ["chrome_trace", "write_chrome_trace"]


def _rows(events: Sequence[lanes.OpEvent]) -> List[int]:
    """The row of each event (same order as `events`): the first row free at its start."""
    order = sorted(range(len(events)), key=lambda i: (events[i].start, -events[i].duration))
    row_ends: List[int] = []
    rows = [0] * len(events)
    for i in order:
        event = events[i]
        row = next((r for r, end in enumerate(row_ends) if end <= event.start), None)
        if row is None:
            row = len(row_ends)
            row_ends.append(event.end)
        row_ends[row] = event.end
        rows[i] = row
    return rows


def _tower_ordered_lanes(step_stats, profile):
    """[(label, events)]: the towers' lanes first, by tower, each labelled 'tower i
    (device)'; then the other lanes in the trace's order."""
    tower_by_device = {tower.device: tower.index for tower in profile.towers}
    labelled = []
    for order, (lane, events) in enumerate(lanes.lane_events(step_stats).items()):
        device = events[0].device if events else lane
        tower = tower_by_device.get(device, tower_by_device.get(lane))
        label = lane if tower is None else f"tower {tower} ({lane})"
        rank = (0, tower, order) if tower is not None else (1, 0, order)
        labelled.append((rank, label, events))
    return [(label, events) for _, label, events in sorted(labelled, key=lambda x: x[0])]


def chrome_trace(run_metadata_or_step_stats, *, tower_devices: Optional[Sequence[str]] = None,
                 profile: Optional[analysis.StepProfile] = None) -> Dict:
    """The trace as a JSON-ready dict (see the module doc).

    Args:
      run_metadata_or_step_stats: a RunMetadata of a FULL_TRACE run, or its step_stats.
      tower_devices: as analyze_step takes them; used when `profile` is None.
      profile: the step's analyze_step result, for the towers and the summary;
        computed here when not given.
    """
    step_stats = lanes.step_stats_of(run_metadata_or_step_stats)
    if profile is None:
        profile = analysis.analyze_step(step_stats, tower_devices)
    origin = profile.start_micros
    trace_events = []
    for pid, (label, events) in enumerate(_tower_ordered_lanes(step_stats, profile)):
        trace_events.append({"ph": "M", "name": "process_name", "pid": pid,
                             "args": {"name": label}})
        trace_events.append({"ph": "M", "name": "process_sort_index", "pid": pid,
                             "args": {"sort_index": pid}})
        for event, row in zip(events, _rows(events)):
            phase = phases.classify(event.name, event.op_type)
            trace_events.append({
                "ph": "X", "name": event.op_type or event.name, "cat": phase,
                "pid": pid, "tid": row, "ts": event.start - origin, "dur": event.duration,
                "args": {"name": event.name, "op": event.op_type, "phase": phase,
                         "tower": profile.tower_of(event.name, event.device)}})
    return {"traceEvents": trace_events, "displayTimeUnit": "ms",
            "otherData": {"summary": profile.summary_line()}}


def write_chrome_trace(run_metadata_or_step_stats, path, *,
                       tower_devices: Optional[Sequence[str]] = None,
                       profile: Optional[analysis.StepProfile] = None) -> str:
    """Writes chrome_trace(...) to `path` atomically (temporary file, then os.replace).

    Returns:
      `path`, as a str.
    """
    trace = chrome_trace(run_metadata_or_step_stats, tower_devices=tower_devices,
                         profile=profile)
    path = str(path)
    with atomic.replacing(path) as temporary:
        with open(temporary, "w", encoding="utf-8") as stream:
            json.dump(trace, stream, separators=(",", ":"))
    return path

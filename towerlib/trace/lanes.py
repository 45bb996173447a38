"""Reading a step's `step_stats`: one op event per execution, each on its device.

TensorFlow writes one `DeviceStepStats` (a "lane") per place it recorded
ops; `dev_stats[i].device` names it. On CPUs a lane is a device:

    /job:localhost/replica:0/task:0/device:CPU:1

With a GPU tracer there are more lanes per GPU, and they repeat each other:

    /job:localhost/replica:0/task:0/device:GPU:0   the executor: host-side op
                                                   time (for a kernel, its launch)
    /device:GPU:0/stream:all                       every kernel
    /device:GPU:0/stream:7                         the kernels of stream 7 (again)
    /device:GPU:0/stream:7<MemcpyH2D>              a stream's copies
    /device:GPU:0/memcpy                           every copy (again)
    /host:CPU                                      host activity (again)

`device_events` keeps each execution once, on its device (the executor
lane's name):

  - kernels from 'stream:all' when it is there, else from the per-stream
    lanes; copies from 'memcpy' when it is there, else from the per-stream
    copy lanes; the unknown-stream lane 'stream:' as it is; then events
    repeated within what is kept (same name, start and end) counted once;
  - an executor-lane op of a GPU that has kernel lanes is dropped when its
    name has kernels there (its interval is the launch, the kernels are the
    work) and kept otherwise (ops without kernels: shapes, sends, no-ops);
  - '/host:CPU' lanes are left out (they repeat the executor lanes).

`lane_events` gives every lane's events as recorded, for the Chrome trace.
A kernel's node name 'tower_0/conv1/Conv2D:Conv2D' is split into the op's
name and type; an executor lane's type comes from its timeline label
'name = Type(inputs)'.
"""

import dataclasses
import re
from typing import Dict, List, Optional, Tuple

__all__ = ["DeviceKey", "OpEvent", "device_events", "lane_events", "parse_device",
           "step_stats_of"]

_DEVICE = re.compile(r"(?:^|/)(?:device:)?(?P<type>[A-Za-z_]+):(?P<index>\d+)$")
_TASK_PART = re.compile(r"^(?P<key>job|replica|task):(?P<value>[^/]*)$")
_LANE = re.compile(r"^(?P<base>.*?/device:[A-Za-z_]+:\d+)(?P<suffix>/.*)?$")
_STREAM = re.compile(r"^/stream:(?P<id>all|\d*)(?:<(?P<what>[^>]*)>)?$")


@dataclasses.dataclass(frozen=True)
class DeviceKey:
    """What a device string names: type ('CPU', 'GPU'), index, and the task if said."""

    device_type: str
    index: int
    job: Optional[str] = None
    replica: Optional[str] = None
    task: Optional[str] = None

    def matches(self, other: "DeviceKey") -> bool:
        """Same type and index, and the same job/replica/task where both say one."""
        if (self.device_type, self.index) != (other.device_type, other.index):
            return False
        return all(mine is None or theirs is None or mine == theirs
                   for mine, theirs in ((self.job, other.job),
                                        (self.replica, other.replica),
                                        (self.task, other.task)))


def parse_device(text: str) -> Optional[DeviceKey]:
    """'/job:w/replica:0/task:1/device:GPU:0', '/gpu:0', 'CPU:1' -> DeviceKey; else None."""
    parts = [p for p in text.strip().split("/") if p]
    where = {}
    while parts and _TASK_PART.match(parts[0]):
        match = _TASK_PART.match(parts.pop(0))
        where[match["key"]] = match["value"]
    match = _DEVICE.search("/".join(parts))
    if match is None or len(parts) not in (1, 2):
        return None
    return DeviceKey(match["type"].upper(), int(match["index"]), where.get("job"),
                     where.get("replica"), where.get("task"))


@dataclasses.dataclass(frozen=True)
class OpEvent:
    """One recorded op execution.

    Attributes:
      name: the op's node name, without a kernel's ':Type' suffix.
      op_type: 'Conv2D', 'MemcpyH2D', ... ('' when the trace does not say).
      start, end: [start, end) in microseconds since the epoch (the trace's
        all_start_micros and all_start_micros + all_end_rel_micros).
      device: the device it ran on (its executor lane's name when known).
      lane: the `dev_stats` entry it was read from.
    """

    name: str
    op_type: str
    start: int
    end: int
    device: str
    lane: str

    @property
    def duration(self) -> int:
        return self.end - self.start


def step_stats_of(run_metadata_or_step_stats):
    """The StepStats of a RunMetadata, or the argument when it is a StepStats."""
    if hasattr(run_metadata_or_step_stats, "dev_stats"):
        return run_metadata_or_step_stats
    if hasattr(run_metadata_or_step_stats, "step_stats"):
        return run_metadata_or_step_stats.step_stats
    raise TypeError("expected a tf.compat.v1.RunMetadata or its step_stats, got "
                    f"{type(run_metadata_or_step_stats).__name__}")


def _lane_kind(lane: str) -> Tuple[str, str]:
    """(kind, base device string) of a lane; kind in executor, stream_all,
    stream, stream_copy, stream_unknown, memcpy, host."""
    if lane.startswith("/host:"):
        return "host", lane
    match = _LANE.match(lane)
    if match is None or not match["suffix"]:
        return "executor", lane
    suffix = match["suffix"]
    if suffix == "/memcpy":
        return "memcpy", match["base"]
    stream = _STREAM.match(suffix)
    if stream is None:
        return "executor", lane
    if stream["id"] == "all":
        return "stream_all", match["base"]
    if not stream["id"]:
        return "stream_unknown", match["base"]
    what = (stream["what"] or "").lower()
    return ("stream_copy" if what.startswith("memcpy") else "stream"), match["base"]


def _device_names(lanes: List[str]) -> Dict[str, str]:
    """{lane: its device's name}: a stream lane goes to the executor lane of
    the same device type and index (when exactly one lane is such)."""
    executors = [lane for lane in lanes if _lane_kind(lane)[0] == "executor"]
    names = {}
    for lane in lanes:
        kind, base = _lane_kind(lane)
        if kind in ("executor", "host"):
            names[lane] = lane
            continue
        key = parse_device(base)
        same = [e for e in executors
                if key is not None and (parse_device(e) is not None)
                and key.matches(parse_device(e))]
        names[lane] = same[0] if len(same) == 1 else base
    return names


def _op_type(node_name: str, label: str, kind: str) -> Tuple[str, str]:
    """(name, op type) of a node_stats entry."""
    name, _, type_suffix = node_name.partition(":")
    if " = " in label:
        right = label.split(" = ", 1)[1]
        return name, right.split("(", 1)[0].strip()
    if type_suffix:
        return name, type_suffix
    if kind in ("memcpy", "stream_copy") and label:
        return name, label.split()[0]
    return name, ""


def lane_events(step_stats) -> Dict[str, List[OpEvent]]:
    """{lane name: its events as recorded}, lanes in the trace's order."""
    lanes = [ds.device for ds in step_stats.dev_stats]
    devices = _device_names(lanes)
    result: Dict[str, List[OpEvent]] = {}
    for ds in step_stats.dev_stats:
        kind = _lane_kind(ds.device)[0]
        events = result.setdefault(ds.device, [])
        for node in ds.node_stats:
            name, op_type = _op_type(node.node_name, node.timeline_label, kind)
            start = int(node.all_start_micros)
            events.append(OpEvent(name, op_type, start,
                                  start + max(int(node.all_end_rel_micros), 0),
                                  devices[ds.device], ds.device))
    return result


def device_events(step_stats) -> Dict[str, List[OpEvent]]:
    """{device: its op executions, each once}, by the rules in the module doc.

    Devices come in the order their first lane appears in the trace; each
    device's events are sorted by (start, end, name).
    """
    by_lane = lane_events(step_stats)
    kinds: Dict[str, Dict[str, List[str]]] = {}
    for lane, events in by_lane.items():
        kind = _lane_kind(lane)[0]
        if kind == "host":
            continue
        device = events[0].device if events else _device_names([lane])[lane]
        kinds.setdefault(device, {}).setdefault(kind, []).append(lane)
    result = {}
    for device, lanes in kinds.items():
        kernel_lanes = lanes.get("stream_all") or lanes.get("stream", [])
        copy_lanes = lanes.get("memcpy") or lanes.get("stream_copy", [])
        chosen = kernel_lanes + copy_lanes + lanes.get("stream_unknown", [])
        seen, events = set(), []
        for lane in chosen:
            for event in by_lane[lane]:
                key = (event.name, event.start, event.end)
                if key not in seen:
                    seen.add(key)
                    events.append(event)
        with_kernels = {event.name for event in events}
        for lane in lanes.get("executor", []):
            events.extend(e for e in by_lane[lane] if e.name not in with_kernels)
        result[device] = sorted(events, key=lambda e: (e.start, e.end, e.name))
    return result

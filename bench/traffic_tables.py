"""bench/traffic.py's two Markdown tables, from counted rows (bench/traffic_rows.py).

markdown_table: per row, the busiest device and its MB sent / received, the
MB moved by all devices, the input batch's share, the step-time floor at each
link bandwidth and that floor over the same model and tower count's ps/cpu
floor (the baseline every variable update is compared with).

breakdown_table: per row, what crosses by kind (variable reads, computed
tensors, input) and the collectives, which says why the floors differ.

MB are 10^6 bytes, as link bandwidths are quoted (GB/s = 10^9 bytes/s).
"""

import collections
from typing import List

from bench.traffic_rows import TrafficRow

MB = 1e6


def markdown_table(rows: List[TrafficRow], bandwidths_gbps: List[float]) -> str:
    """The report: one line per row, floors at each bandwidth, ratios to ps/cpu."""
    header = ["model", "towers", "variable update", "busiest device",
              "its MB sent / received per step", "MB moved per step (all devices)",
              "of which input batch (MB)"]
    header += [f"floor at {w:g} GB/s (ms)" for w in bandwidths_gbps]
    header += ["floor / ps/cpu floor"]
    lines = ["| " + " | ".join(header) + " |",
             "| " + " | ".join(["---"] * 3 + ["---"] + ["---:"] * (len(header) - 4)) + " |"]
    baseline = {(r.model, r.towers): r for r in rows if r.update == "ps/cpu"}
    for row in rows:
        device, sent, received = row.busiest
        cells = [row.model, str(row.towers), row.update, device.replace("/device:", ""),
                 f"{sent / MB:.1f} / {received / MB:.1f}", f"{row.total_bytes / MB:.1f}",
                 f"{row.input_bytes / MB:.2f}"]
        cells += [f"{row.floor_seconds(w * 1e9) * 1e3:.2f}" for w in bandwidths_gbps]
        base = baseline.get((row.model, row.towers))
        cells.append(f"{row.floor_seconds(1.0) / base.floor_seconds(1.0):.2f}x"
                     if base else "")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def breakdown_table(rows: List[TrafficRow]) -> str:
    """MB crossing devices per step by what it is, and the collectives' count.

    'largest on one device' is the bytes of the trainable variables on the
    device holding most (tower 0's copies for 'replicated'): with ps/gpu it
    sets the busiest GPU's traffic, S + (T - 2) x that.
    """
    lines = ["| model | towers | variable update | weights (MB) | largest on one device (MB) | "
             "variable reads (MB) | computed tensors (MB) | input (MB) | "
             "collectives: ops, MB all-reduced per device |",
             "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for row in rows:
        by_kind = collections.Counter()
        for edge in row.traffic.edges:
            by_kind[edge.kind] += edge.num_bytes
        parts = row.traffic.collectives
        devices = {p.device for p in parts}
        payload = sum(p.payload_bytes for p in parts) / max(len(devices), 1)
        lines.append(
            f"| {row.model} | {row.towers} | {row.update} | {row.weight_bytes / MB:.1f} | "
            f"{max(row.weights_by_device.values()) / MB:.1f} | "
            f"{by_kind['variable'] / MB:.1f} | {by_kind['computed'] / MB:.1f} | "
            f"{by_kind['input'] / MB:.2f} | "
            f"{len(parts) // max(len(devices), 1)}, {payload / MB:.1f} |")
    return "\n".join(lines)

"""The traffic report across machines: rows, Markdown tables and the generated page.

    python -m bench.traffic --machines=2,4,8 --devices=8 \
        --output=docs/traffic_across_machines.md

For each machine count W, one worker's step is built (never run) twice,
with N towers on '/job:worker/task:0/device:GPU:i' (bench/traffic_machines.py
says how it is counted):

  all-reduce    build_sync_train_graph(update=towerlib.Replicated()), no ps task
  ps            build_sync_train_graph with P ps tasks (SyncReplicasOptimizer)

and gives four rows: the all-reduce; a hierarchical all-reduce as a
reference (not built by towerlib: what two levels would move); the
parameter server with its P tasks on machines of their own; and the same
with ps task p on worker machine p. MB are 10^6 bytes; link speeds are in
Gb/s (10^9 bits/s) as network links are quoted.
"""

import dataclasses
import subprocess
import sys
from typing import Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

from bench import traffic_machines as tm
from bench.traffic_model import make_traffic_model

MB = 1e6
PATH_LABELS = {
    tm.ALL_REDUCE: "all-reduce (ring over W x N)",
    tm.HIERARCHICAL: "hierarchical all-reduce (reference, not built)",
    tm.PS_SEPARATE: "parameter server, P ps machines",
    tm.PS_COLOCATED: "parameter server, ps task p on worker machine p",
}


@dataclasses.dataclass
class MachineRow:
    """One (model, W machines x N devices, path): each machine link's bytes per step."""

    model: str
    workers: int
    towers: int
    path: str
    num_ps: int  # 0 for the all-reduce
    weight_bytes: int  # S
    links: Dict[str, Tuple[float, float]]  # {machine: (sent, received)}
    count: Optional[tm.WorkerCount] = None  # the worker's count it came from

    @property
    def busiest(self) -> Tuple[str, float, float]:
        """(machine, sent, received) of the link with the largest max(sent, received)."""
        machine = max(self.links, key=lambda m: (max(self.links[m]), m))
        return (machine,) + tuple(self.links[machine])

    def link(self, prefix: str) -> Optional[Tuple[float, float]]:
        """(sent, received) of the busiest link among machines named `prefix`..."""
        named = {m: v for m, v in self.links.items() if m.startswith(prefix)}
        if not named:
            return None
        return named[max(named, key=lambda m: (max(named[m]), m))]

    def floor_seconds(self, bits_per_second: float) -> float:
        """max over links of max(sent, received) x 8 / bandwidth (full duplex, no overlap)."""
        _, sent, received = self.busiest
        return max(sent, received) * 8 / bits_per_second


def _make_inputs(batch: int):
    def make():
        return (tf.zeros([batch, 32, 32, 3], tf.float32, name="images"),
                tf.zeros([batch], tf.int32, name="labels"))
    return make


def count_path(model_name: str, workers: int, towers: int, path: str, num_ps: int = 0,
               batch_per_tower: int = 32, bn_mode: str = "first_tower",
               worker_index: int = 0) -> Tuple[tm.WorkerCount, int]:
    """Builds worker `worker_index`'s step (W workers x N GPU towers) and counts it.

    Returns:
      (the count, S the trainable bytes).
    """
    graph, train_op = tm.build_worker_step(
        make_traffic_model(model_name), _make_inputs(batch_per_tower * towers), workers,
        towers, path, num_ps=num_ps, worker_index=worker_index, bn_mode=bn_mode)
    with graph.as_default():
        return tm.count_worker(train_op, workers), tm.trainable_bytes(graph)


def rows_for(model_name: str, workers: int, towers: int, num_ps: int = 0,
             batch_per_tower: int = 32, bn_mode: str = "first_tower",
             log=None) -> List[MachineRow]:
    """The four rows of one (model, W, N): two builds, counted.

    Args:
      num_ps: P; 0 means P = W.
      log: a file for progress lines (None: quiet).
    """
    num_ps = num_ps or workers
    rows = []
    allreduce, weight_bytes = count_path(model_name, workers, towers, tm.ALL_REDUCE,
                                         batch_per_tower=batch_per_tower, bn_mode=bn_mode)
    rows.append(MachineRow(model_name, workers, towers, tm.ALL_REDUCE, 0, weight_bytes,
                           allreduce.machine_links(), allreduce))
    hierarchical = sum(
        tm.hierarchical_bytes(g.payload_bytes, workers) if g.kind == tm.ALL_REDUCE
        else (g.group_size - g.local_members) * g.payload_bytes
        for g in allreduce.groups if g.crossing_bytes)
    machines = {m: (hierarchical, hierarchical) for m in rows[0].links}
    rows.append(MachineRow(model_name, workers, towers, tm.HIERARCHICAL, 0, weight_bytes,
                           machines, allreduce))
    if log:
        print(f"counted {model_name} {workers}x{towers} all-reduce: "
              f"{len(allreduce.groups)} collectives per tower, "
              f"{len(allreduce.task_bytes)} cross-task edges", file=log, flush=True)
    ps, _ = count_path(model_name, workers, towers, tm.PS_SEPARATE, num_ps=num_ps,
                       batch_per_tower=batch_per_tower, bn_mode=bn_mode)
    rows.append(MachineRow(model_name, workers, towers, tm.PS_SEPARATE, num_ps, weight_bytes,
                           ps.machine_links(), ps))
    if num_ps <= workers:
        rows.append(MachineRow(model_name, workers, towers, tm.PS_COLOCATED, num_ps,
                               weight_bytes, ps.machine_links(tm.colocated(num_ps)), ps))
    if log:
        print(f"counted {model_name} {workers}x{towers} ps (P={num_ps}): "
              f"{len(ps.task_bytes)} task pairs", file=log, flush=True)
    return rows


def _pair(link: Optional[Tuple[float, float]]) -> str:
    return "" if link is None else f"{link[0] / MB:.1f} / {link[1] / MB:.1f}"


def markdown_table(rows: List[MachineRow], bandwidths_gbits: Sequence[float]) -> str:
    """Per row: the busiest link, the worker and ps links, the floors, the ratio to all-reduce."""
    header = ["model", "machines x GPUs", "path", "busiest link",
              "its MB sent / received per step", "worker link MB sent / received",
              "busiest ps link MB sent / received"]
    header += [f"floor at {w:g} Gb/s (ms)" for w in bandwidths_gbits]
    header += ["floor / all-reduce floor"]
    lines = ["| " + " | ".join(header) + " |",
             "| " + " | ".join(["---"] * 4 + ["---:"] * (len(header) - 4)) + " |"]
    baseline = {(r.model, r.workers, r.towers): r for r in rows if r.path == tm.ALL_REDUCE}
    for row in rows:
        machine, sent, received = row.busiest
        label = PATH_LABELS[row.path]
        if row.num_ps:
            label += f" (P = {row.num_ps})"
        busiest = "every worker" if row.path in (tm.ALL_REDUCE, tm.HIERARCHICAL) else (
            machine.lstrip("/").replace("job:", "").replace("/task:", " "))
        ps_link = row.link("/job:ps") if row.path == tm.PS_SEPARATE else None
        cells = [row.model, f"{row.workers} x {row.towers}", label, busiest,
                 f"{sent / MB:.1f} / {received / MB:.1f}",
                 _pair(row.link("/job:worker")), _pair(ps_link)]
        cells += [f"{row.floor_seconds(w * 1e9) * 1e3:.1f}" for w in bandwidths_gbits]
        base = baseline.get((row.model, row.workers, row.towers))
        cells.append(f"{row.floor_seconds(1.0) / base.floor_seconds(1.0):.2f}x" if base else "")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def breakdown_table(rows: List[MachineRow]) -> str:
    """Where the bytes come from: the collectives, and the parameter server's edges."""
    lines = ["| model | machines x GPUs | weights S (MB) | all-reduce: collectives per GPU, "
             "MB per GPU, group size | ring bytes per link / S | ps: MB each worker pushes "
             "up / reads down | up / S, down / S | P | largest ps task's weights (MB) / S/P |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    by_key = {}
    for row in rows:
        by_key.setdefault((row.model, row.workers, row.towers), {})[row.path] = row
    for (model, workers, towers), paths in by_key.items():
        allreduce, ps = paths.get(tm.ALL_REDUCE), paths.get(tm.PS_SEPARATE)
        cells = [model, f"{workers} x {towers}"]
        weight_bytes = (allreduce or ps).weight_bytes
        cells.append(f"{weight_bytes / MB:.1f}")
        if allreduce:
            groups = allreduce.count.groups
            payload = sum(g.payload_bytes for g in groups)
            sizes = sorted({g.group_size for g in groups})
            cells += [f"{len(groups)}, {payload / MB:.1f}, {'/'.join(map(str, sizes))}",
                      f"{allreduce.count.crossing_bytes / weight_bytes:.3f}"]
        else:
            cells += ["", ""]
        if ps:
            worker = ps.count.worker
            up, down = worker_up_down(ps)
            per_task = {}
            for (source, destination), num_bytes in ps.count.task_bytes.items():
                if destination == worker and source.startswith("/job:ps"):
                    per_task[source] = per_task.get(source, 0) + num_bytes
            largest = max(per_task.values()) / towers  # the weights it holds, read once
            cells += [f"{up / MB:.1f} / {down / MB:.1f}",
                      f"{up / weight_bytes:.2f}, {down / weight_bytes:.2f}", str(ps.num_ps),
                      f"{largest / MB:.1f} / {largest * ps.num_ps / weight_bytes:.2f}x"]
        else:
            cells += ["", "", "", ""]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def worker_up_down(row: MachineRow) -> Tuple[float, float]:
    """(bytes the counted worker sends to other tasks, bytes it receives) in its graph."""
    worker = row.count.worker
    up = sum(b for (source, _), b in row.count.task_bytes.items() if source == worker)
    down = sum(b for (_, destination), b in row.count.task_bytes.items()
               if destination == worker)
    return up, down


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def explanation(rows: List[MachineRow], bandwidths_gbits: Sequence[float]) -> List[str]:
    """The page's 5-10 lines of findings, with the numbers of these rows (the first model's)."""
    rows = [r for r in rows if r.model == rows[0].model]
    by = {(r.workers, r.path): r for r in rows}
    workers = sorted({r.workers for r in rows})
    towers = rows[0].towers
    weight_mb = rows[0].weight_bytes / MB
    slow = min(bandwidths_gbits)

    def floor(w, path):
        row = by.get((w, path))
        return None if row is None else row.floor_seconds(slow * 1e9) * 1e3

    def ratios(path):
        return ", ".join(f"{floor(w, path) / floor(w, tm.ALL_REDUCE):.1f}x" for w in workers
                         if floor(w, path) is not None)

    def link_mb(w, path):
        _, sent, received = by[(w, path)].busiest
        return max(sent, received) / MB

    ws = ", ".join(map(str, workers))
    flat_over_hierarchical = ", ".join(
        f"{link_mb(w, tm.ALL_REDUCE) / link_mb(w, tm.HIERARCHICAL):.2f}x" for w in workers)
    ps_rows = [r for r in rows if r.path == tm.PS_SEPARATE]
    up_ratio = max(worker_up_down(r)[0] for r in ps_rows) / rows[0].weight_bytes
    down_ratio = max(worker_up_down(r)[1] for r in ps_rows) / rows[0].weight_bytes
    lines = [
        f"- **All-reduce: about 2 S per machine link, whatever W.** With S = {weight_mb:.1f} MB "
        f"of gradients the ring sends and receives "
        f"{', '.join(f'{link_mb(w, tm.ALL_REDUCE):.1f}' for w in workers)} MB per step over "
        f"each machine's link at W = {ws} (2 (WN - 1) / WN x S, plus the loss and the "
        f"batch-norm statistics the step all-reduces): a floor of {', '.join(f'{floor(w, tm.ALL_REDUCE):.0f}' for w in workers)}"
        f" ms at {slow:g} Gb/s.",
        f"- **Parameter server: {down_ratio:.1f} x S down and {up_ratio:.1f} x S up per worker "
        f"per step.** Each variable is read once per worker (on the worker's CPU, a caching "
        f"device, then handed to its {towers} towers) and the towers' gradients go up as one "
        "sum per variable (towerlib/update/aggregation.py)"
        + (": the rest is weight decay, whose term TensorFlow computes on the ps task next "
           "to the variable, so each decayed weight's value goes up and the term's gradient "
           "comes down" if up_ratio > 1.5 else "")
        + f". The ps tasks' links carry as much in all. Floor over the all-reduce's: "
        f"{ratios(tm.PS_SEPARATE)} at W = {ws} with ps machines of their own, "
        f"{ratios(tm.PS_COLOCATED)} with ps task p on worker machine p.",
        "- **Fixable in towerlib, and then the parameter server's bytes drop below the "
        "ring's**: computing the decay term on the worker would make it S up and S down per "
        "worker link (0.5x the ring's 2 S), on P = W extra machines; with ps tasks on the "
        "worker machines 2 (W - 1) / W x S each way, what the hierarchical row shows.",
        "- **The hierarchical row is not built by towerlib**: a two-level all-reduce "
        "(reduce-scatter in the machine, N rings of W across machines, all-gather) moves "
        f"2 (W - 1) / W x S ({', '.join(f'{link_mb(w, tm.HIERARCHICAL):.0f}' for w in workers)}"
        " MB), the least any all-reduce can when each machine holds its own gradients; the "
        f"flat ring moves {flat_over_hierarchical} of it. NCCL's tree algorithm would not "
        "lower the bytes (2 S per machine; it saves latency, not bandwidth): the argument "
        "is in bench/traffic_machines.py.",
        "- **Floors, not step times**: bytes x 8 / link speed, on full-duplex links "
        "(sending and receiving do not compete) into a non-blocking fabric, with no overlap "
        "of communication with compute or with itself; latency and the gRPC or NCCL "
        "protocol only add to them, overlap with the backward pass only hides them. "
        "Nothing was run: every byte is counted from built graphs.",
    ]
    return lines


def report_page(rows: List[MachineRow], bandwidths_gbits: Sequence[float], command: str,
                batch_per_tower: int, bn_mode: str) -> str:
    """The whole generated page, docs/traffic_across_machines.md."""
    lines = [
        "# Traffic per step across machines",
        "",
        "Generated, do not edit by hand. Regenerate with",
        "",
        "```bash",
        command,
        "```",
        "",
        f"Graphs built at commit {_commit()}, never run (no GPU, no server). Each machine "
        f"has {rows[0].towers} GPUs (towers on '/job:worker/task:r/device:GPU:i'); "
        f"{batch_per_tower} 32x32x3 float32 images per GPU (they never leave their "
        f"machine), Momentum, bn_mode={bn_mode}, all-reduce buffers of 4 MB (towerlib."
        "Replicated's default pack_bytes) with NCCL collectives. Counting and model: "
        "bench/traffic_machines.py; method of the one-machine counts: BENCHMARKS.md, "
        "\"Traffic per step, counted from the graph\".",
        "",
        markdown_table(rows, bandwidths_gbits),
        "",
        *explanation(rows, bandwidths_gbits),
        "",
        "Where the bytes come from (per worker's step):",
        "",
        breakdown_table(rows),
        "",
    ]
    return "\n".join(lines)


def count_rows(models: Sequence[str], machines: Sequence[int], towers: int, num_ps: int,
               batch_per_tower: int, bn_mode: str) -> List[MachineRow]:
    rows = []
    for model_name in models:
        for workers in machines:
            rows += rows_for(model_name, workers, towers, num_ps, batch_per_tower, bn_mode,
                             log=sys.stderr)
    return rows

"""What building the training step costs: time, graph size, first step, memory.

    python -m bench.bench_build                                  # the full sweep
    python -m bench.bench_build --towers=1,8 --k=1 --updates=parameter_server,replicated,handwritten
    python -m bench.bench_build --towers=8 --k=1,4 --skip_first_step --time_limit=300

For the ResNet-50-sized model (bench/traffic_model.py: ResNet-50's 25.6 M
weights on 32x32 images, global batch 512, virtual CPU towers), each
configuration is built in a fresh Python process, one after the other:

  towers      1, 2, 4, 8 ('/device:CPU:i', TensorFlow's virtual CPU devices)
  k           accumulation_steps 1, 4, 16, 64 (micro-batches per step)
  updates     parameter_server (towerlib.ParameterServer()), replicated
              (towerlib.Replicated()), and handwritten: the classic tower loop
              of bench/handwritten.py, at k=1 only (it has no accumulation)

and measured:

  build s     wall time of build_train_graph (of build_train_op, handwritten)
  build CPU s the process's CPU time for it: steadier than wall time on a
              shared machine, the build is one Python thread
              (the progress lines on stderr also give the part of it spent
              in Python's garbage collector, and its full collections)
  GraphDef MB the serialized graph, after the build (as_graph_def().ByteSize())
  nodes       the graph's nodes, those of its functions (the accumulation
              loop's body) included: deterministic, unlike the times
  1st step s  the first session.run of the train op after the initializers
              (TensorFlow prunes, places and partitions the graph there)
  peak RSS GB the child's ru_maxrss (os.wait4), build and first step

Each column is followed by its ratio to the same update's 1-tower k=1 row
(x1), when that row was measured; a second table gives replicated and
handwritten against the parameter server at the same towers and k. A
configuration still building (or stepping) after --time_limit seconds is
stopped and printed as 'over limit'; one whose global batch cannot give
every tower an example per micro-batch (towers x k > global batch) as 'n/a'.
Progress goes to stderr, the Markdown tables to stdout.
"""

import argparse
import dataclasses
import gc
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Sequence, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TOWERS = (1, 2, 4, 8)
ACCUMULATION_STEPS = (1, 4, 16, 64)
PARAMETER_SERVER, REPLICATED, HANDWRITTEN = "parameter_server", "replicated", "handwritten"
UPDATES = (PARAMETER_SERVER, REPLICATED, HANDWRITTEN)
DEFAULT_MODEL = "resnet50_sized"
DEFAULT_GLOBAL_BATCH = 512  # 8 towers x 64 micro-batches of one example
DEFAULT_TIME_LIMIT = 900.0

OVER_LIMIT = "over limit"
NOT_APPLICABLE = "n/a"
_RESULT_PREFIX = "BENCH_BUILD_RESULT "

# The measured columns: (key, heading, format).
METRICS = (
    ("build_seconds", "build s", "{:.1f}"),
    ("build_cpu_seconds", "build CPU s", "{:.1f}"),
    ("graph_def_mb", "GraphDef MB", "{:.1f}"),
    ("nodes", "nodes", "{:,d}"),
    ("first_step_seconds", "1st step s", "{:.1f}"),
    ("peak_rss_gb", "peak RSS GB", "{:.2f}"),
)


@dataclasses.dataclass(frozen=True)
class Config:
    """One build: an update at a tower count and accumulation steps."""

    update: str
    towers: int
    k: int

    @property
    def label(self) -> str:
        return f"{self.update} x{self.towers} k={self.k}"


@dataclasses.dataclass
class Result:
    """A configuration's measurements; status 'ok', OVER_LIMIT, NOT_APPLICABLE or 'failed'."""

    config: Config
    status: str = "ok"
    values: Dict[str, float] = dataclasses.field(default_factory=dict)
    reason: str = ""


def configurations(towers: Sequence[int], ks: Sequence[int],
                   updates: Sequence[str]) -> List[Config]:
    """Every (update, towers, k) to run, in table order; handwritten at k=1 only."""
    return [Config(update, t, k) for update in updates for t in towers for k in ks
            if update != HANDWRITTEN or k == 1]


# ------------------------------------------------------------------ the child


def _child_main(spec: dict) -> None:
    """Builds one configuration, prints its build results, then its first step's."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    import towerlib
    from bench import handwritten
    from bench.traffic_model import make_traffic_model

    update, towers, k = spec["update"], spec["towers"], spec["k"]
    batch = spec["global_batch"]
    devices = [f"/device:CPU:{i}" for i in range(towers)]
    model = make_traffic_model(spec["model"])
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(1)
        with tf.device("/device:CPU:0"):  # the input pipeline's host
            images = tf.random.uniform([batch, 32, 32, 3], seed=1, name="images")
            labels = tf.random.uniform([batch], maxval=10, dtype=tf.int32, seed=2,
                                       name="labels")
        optimizer = tf.compat.v1.train.MomentumOptimizer(0.1, 0.9)
        gc_clock = _GcClock()
        wall, cpu = time.perf_counter(), time.process_time()
        if update == HANDWRITTEN:
            train_op = handwritten.build_train_op(model, (images, labels), optimizer, devices)
            config = handwritten.session_config(towers)
        else:
            choice = towerlib.Replicated() if update == REPLICATED else towerlib.ParameterServer()
            train_op = towerlib.build_train_graph(
                model, (images, labels), optimizer, devices=devices, update=choice,
                accumulation_steps=k).train_op
            config = towerlib.session_config(towers)
        build = {"build_seconds": time.perf_counter() - wall,
                 "build_cpu_seconds": time.process_time() - cpu}
        build.update(gc_clock.stop())
        graph_def = graph.as_graph_def()
        # An accumulated step's towers are the body of a loop: its function counts too.
        nodes = len(graph_def.node) + sum(len(f.node_def) for f in graph_def.library.function)
        build.update(graph_def_mb=graph_def.ByteSize() / 1e6, nodes=nodes)
        del graph_def
        _report(build)
        if not spec["first_step"]:
            return
        with tf.compat.v1.Session(graph=graph, config=config) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(tf.compat.v1.local_variables_initializer())  # replicated copies
            wall = time.perf_counter()
            session.run(train_op)
            _report({"first_step_seconds": time.perf_counter() - wall})


class _GcClock:
    """CPU time in Python's garbage collector (the building thread's), and its full
    (generation 2) collections.

    A build makes ~300k long-lived Python objects; a full collection walks
    all of them and comes each time their number has grown by a quarter,
    so one more or fewer moves the build time by ~0.3 s at 8 towers. The
    progress lines show the collector's share so that a difference can be read.
    """

    def __init__(self):
        self._seconds, self._full, self._started = 0.0, 0, None
        gc.callbacks.append(self._on_collection)

    def _on_collection(self, phase, info):
        if phase == "start":
            self._started = time.thread_time()
        elif self._started is not None:
            self._seconds += time.thread_time() - self._started
            self._full += info["generation"] == 2
            self._started = None

    def stop(self) -> dict:
        gc.callbacks.remove(self._on_collection)
        return {"build_gc_seconds": self._seconds, "full_gcs": self._full}


def _report(values: dict) -> None:
    print(_RESULT_PREFIX + json.dumps(values), flush=True)


# ----------------------------------------------------------------- the parent


def run_config(config: Config, *, model: str, global_batch: int, first_step: bool,
               time_limit: float, log_dir: Optional[str] = None) -> Result:
    """Runs one configuration in a fresh process, stopped after `time_limit` seconds."""
    if config.towers * config.k > global_batch:
        return Result(config, NOT_APPLICABLE,
                      reason=f"global batch {global_batch} < towers x k")
    spec = dict(update=config.update, towers=config.towers, k=config.k, model=model,
                global_batch=global_batch, first_step=first_step)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    with tempfile.TemporaryFile("w+") as out, _log_file(log_dir, config) as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "bench.bench_build", "--child", json.dumps(spec)],
            cwd=ROOT, env=env, stdout=out, stderr=err)
        status, usage = _wait(process, time_limit)
        out.seek(0)
        values = {}
        for line in out.read().splitlines():
            if line.startswith(_RESULT_PREFIX):
                values.update(json.loads(line[len(_RESULT_PREFIX):]))
        reason = _tail(err) if status not in (0, None) else ""
    if usage is not None:
        values["peak_rss_gb"] = usage.ru_maxrss * 1024 / 1e9  # Linux: kilobytes
    if status is None:  # stopped at the time limit
        return Result(config, OVER_LIMIT, values,
                      reason=f"still running after {time_limit:g} s")
    if status != 0:
        return Result(config, "failed", values, reason=reason)
    return Result(config, "ok", values)


def _wait(process, time_limit) -> Tuple[Optional[int], Optional[resource.struct_rusage]]:
    """(exit status or None when killed at the limit, the child's resource usage)."""
    deadline = time.monotonic() + time_limit
    while True:
        pid, status, usage = os.wait4(process.pid, os.WNOHANG)
        if pid:
            process.returncode = os.waitstatus_to_exitcode(status)  # reaped here
            return process.returncode, usage
        if time.monotonic() > deadline:
            process.kill()
            _, _, usage = os.wait4(process.pid, 0)
            process.returncode = -9
            return None, usage
        time.sleep(0.1)


class _log_file:
    """The child's stderr: a file in `log_dir`, or a temporary one."""

    def __init__(self, log_dir, config):
        self._path = (os.path.join(log_dir, f"{config.update}_x{config.towers}_k{config.k}.log")
                      if log_dir else None)

    def __enter__(self):
        if self._path:
            os.makedirs(os.path.dirname(self._path), exist_ok=True)
            self._file = open(self._path, "w+")
        else:
            self._file = tempfile.TemporaryFile("w+")
        return self._file

    def __exit__(self, *exc):
        self._file.close()


def _tail(err, lines=3) -> str:
    err.seek(0)
    text = [line for line in err.read().splitlines() if line.strip()]
    return " | ".join(text[-lines:])


# ------------------------------------------------------------------ the tables


def _cell(result: Result, key: str, fmt: str) -> str:
    value = result.values.get(key)
    if value is not None:
        return fmt.format(int(value) if key == "nodes" else value)
    if result.status == "ok":
        return "-"  # e.g. the first step, skipped
    return result.status


def _ratio(value, base) -> str:
    if value is None or not base:
        return "-"
    return f"{value / base:.2f}"


def results_table(results: Sequence[Result]) -> str:
    """Every configuration, each column with its ratio to the update's 1-tower k=1 row."""
    base = {r.config.update: r for r in results
            if r.config.towers == 1 and r.config.k == 1 and r.status == "ok"}
    heading = ["update", "towers", "k"]
    for _, name, _ in METRICS:
        heading += [name, "x1"]
    lines = ["| " + " | ".join(heading) + " |",
             "|" + "|".join(["---"] * 3 + ["--:"] * (2 * len(METRICS))) + "|"]
    for result in results:
        row = [result.config.update, str(result.config.towers), str(result.config.k)]
        one = base.get(result.config.update)
        for key, _, fmt in METRICS:
            row.append(_cell(result, key, fmt))
            row.append(_ratio(result.values.get(key), one.values.get(key) if one else None))
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def comparison_table(results: Sequence[Result]) -> str:
    """Replicated and handwritten over the parameter server at the same towers and k."""
    ps = {(r.config.towers, r.config.k): r for r in results
          if r.config.update == PARAMETER_SERVER and r.status == "ok"}
    keys = [key for key, _, _ in METRICS]
    lines = ["| update / parameter_server | towers | k | "
             + " | ".join(name for _, name, _ in METRICS) + " |",
             "|---|--:|--:|" + "--:|" * len(METRICS)]
    rows = 0
    for result in results:
        other = ps.get((result.config.towers, result.config.k))
        if result.config.update == PARAMETER_SERVER or other is None:
            continue
        cells = [_ratio(result.values.get(key), other.values.get(key)) for key in keys]
        lines.append(f"| {result.config.update} | {result.config.towers} | "
                     f"{result.config.k} | " + " | ".join(cells) + " |")
        rows += 1
    return "\n".join(lines) if rows else ""


def render(results: Sequence[Result], model: str, global_batch: int) -> str:
    parts = [f"Build cost of {model}, global batch {global_batch}, virtual CPU towers; "
             "x1: ratio to the same update's 1-tower k=1 row.", "", results_table(results)]
    comparison = comparison_table(results)
    if comparison:
        parts += ["", "Ratios to the parameter server at the same towers and k:", "",
                  comparison]
    notes = [f"- {r.config.label}: {r.status}: {r.reason}" for r in results if r.reason]
    if notes:
        parts += [""] + notes
    return "\n".join(parts)


# ------------------------------------------------------------------- command line


def _int_list(text):
    return [int(part) for part in text.split(",") if part]


def _update_list(text):
    updates = [part for part in text.split(",") if part]
    unknown = sorted(set(updates) - set(UPDATES))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown update(s) {unknown}; choose from {UPDATES}")
    return updates


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--towers", type=_int_list, default=list(TOWERS),
                        help="tower counts, e.g. 1,8")
    parser.add_argument("--k", type=_int_list, default=list(ACCUMULATION_STEPS),
                        help="accumulation steps, e.g. 1,4")
    parser.add_argument("--updates", type=_update_list, default=list(UPDATES),
                        help="parameter_server, replicated, handwritten (k=1 only)")
    parser.add_argument("--model", default=DEFAULT_MODEL,
                        help="resnet50_sized, or a model of examples/cifar10/models.py")
    parser.add_argument("--global_batch", type=int, default=DEFAULT_GLOBAL_BATCH)
    parser.add_argument("--skip_first_step", action="store_true",
                        help="build only: no session, no first step")
    parser.add_argument("--time_limit", type=float, default=DEFAULT_TIME_LIMIT,
                        help="seconds per configuration (build and first step) before "
                             "it is stopped and printed as 'over limit'")
    parser.add_argument("--rounds", type=int, default=1,
                        help="interleaved rounds; each metric is the median over them")
    parser.add_argument("--log_dir", default=None, help="keep each child's stderr here")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.child is not None:
        _child_main(json.loads(args.child))
        return 0
    configs = configurations(args.towers, args.k, args.updates)
    runs = {config: [] for config in configs}
    for round_index in range(args.rounds):
        # Interleaved: each round runs every configuration once, starting one further on.
        shift = round_index % len(configs)
        for config in configs[shift:] + configs[:shift]:
            print(f"{config.label} (round {round_index + 1}) ...", file=sys.stderr, flush=True)
            result = run_config(config, model=args.model, global_batch=args.global_batch,
                                first_step=not args.skip_first_step,
                                time_limit=args.time_limit, log_dir=args.log_dir)
            shown = ", ".join(f"{key}={value:.3g}" for key, value in result.values.items())
            print(f"{config.label}: {result.status} {shown} {result.reason}".rstrip(),
                  file=sys.stderr, flush=True)
            runs[config].append(result)
    results = [median_result(runs[config]) for config in configs]
    print(render(results, args.model, args.global_batch), flush=True)
    if args.rounds > 1:
        print(f"\nMedians over {args.rounds} interleaved rounds (each configuration once per "
              "round, in a fresh process).", flush=True)
    return 0


def median_result(results: Sequence[Result]) -> Result:
    """One configuration's rounds as one Result: each metric's median over the rounds that
    measured it; the status of the first round that was not ok, if any."""
    failed = [r for r in results if r.status != "ok"]
    values = {}
    for key, _, _ in METRICS:
        measured = sorted(r.values[key] for r in results if r.values.get(key) is not None)
        if measured:
            middle = len(measured) // 2
            values[key] = (measured[middle] if len(measured) % 2
                           else (measured[middle - 1] + measured[middle]) / 2)
    first = failed[0] if failed else results[0]
    return Result(first.config, first.status, values, reason=first.reason)


if __name__ == "__main__":
    sys.exit(main())

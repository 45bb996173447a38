"""Across worker processes: all-reduce, parameter server, MultiWorkerMirroredStrategy.

    python -m bench.bench_multiworker --model=resnet20 --global_batch=64 \
        --repeats=12 --steps=3

The benchmark. Every configuration trains the same model (the CIFAR-10
example's, bench.models) from the same initial weights on the same fixed
global batch, Momentum, bn_mode='first_tower', in its own processes on
127.0.0.1 (bench/multiworker_proc.py):

  one process, 4 towers        towerlib.run_training, update=Replicated() (the baseline)
  all-reduce, 2 workers x 2    build_sync_train_graph(update=Replicated()) +
                               run_distributed_training, no ps
  parameter server, 2 x 2      the same with 1 ps task (SyncReplicasOptimizer)
  all-reduce, 2 workers x 1    towerlib, one tower per worker
  plain loop, 2 x 1            (only with --configs=plain_2x1) the same graph in a plain
                               session.run loop, as MultiWorkerMirroredStrategy is run:
                               the difference is the training loop's hooks
  MultiWorkerMirroredStrategy, 2 workers x 1
                               tf.compat.v1.distribute.experimental.
                               MultiWorkerMirroredStrategy in graph mode (on CPU it
                               makes one replica per worker: it has no virtual-device
                               option), the loss divided by the global batch by hand

Every configuration is built and started first (its processes then wait
before their first step). Then, before anything is timed, every
configuration runs --warmup_steps steps and the losses of those steps, which
all start from the same weights, are compared: towerlib's all-reduce and
MultiWorkerMirroredStrategy with the same replicas (2 x 1) must agree within
--loss_tolerance, and so must the three 4-tower configurations; otherwise the
run stops there. Then repetitions: each runs every configuration in turn (A,
B, C, ..., A, B, C, ...), --segment_warmup_steps untimed steps and --steps
timed steps each, so that load drifting over the run hits them all alike.

Reported per configuration: the median seconds per step over every timed
step (a step's time is the slowest of the configuration's workers; one
iteration of the training loop, hooks included), the ratio of that median to
the baseline's, the median and range of the per-repetition ratios (each
repetition's median step over the baseline's in the same repetition), the
median "session.run" time (from the stepping hook's before_run to its
after_run: the step without most of the training loop's Python and hooks;
for MultiWorkerMirroredStrategy's plain loop, the session.run itself), and
CPU seconds per step of all the configuration's processes together (the ps
task included), read from /proc.

Processes (bench/bench_multiworker_processes.py): every port is a free one found at
start; every process is in its own process group, dies with this one
(PR_SET_PDEATHSIG), is waited for at most --reply_timeout seconds per reply, and
is killed at the end, or by a watchdog once --time_limit seconds have passed.

Not a test: the numbers depend on the machine and on whatever else it runs.
On one machine the "network" is the loopback interface and every process
shares the same cores.
"""

import json
import os
import shlex
import statistics
import sys
import tempfile
import threading
import time

from absl import app, flags

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

from bench import bench_multiworker_processes as processes  # noqa: E402
from bench import coordinator  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("model", "resnet20", "A model of examples/cifar10/models.py.")
flags.DEFINE_integer("global_batch", 64, "Examples per step over all workers and towers.")
flags.DEFINE_integer("repeats", 12, "Interleaved repetitions (each runs every configuration).")
flags.DEFINE_integer("steps", 3, "Timed steps per configuration per repetition.")
flags.DEFINE_integer("segment_warmup_steps", 1,
                     "Untimed steps before each timed segment (the configuration was idle "
                     "while the others ran).")
flags.DEFINE_integer("warmup_steps", 3,
                     "Untimed steps after start, from the shared initial weights; their "
                     "losses are compared across configurations.")
flags.DEFINE_float("loss_tolerance", 1e-4, "Largest loss difference the check accepts.")
flags.DEFINE_float("learning_rate", 0.01, "Momentum (0.9) optimizer's learning rate.")
flags.DEFINE_integer("seed", 0, "Seeds the initial weights and the synthetic batch.")
flags.DEFINE_list("configs", None, "Configurations to run (default: all but plain_2x1, "
                  "the all-reduce graph in a plain session loop, which separates the "
                  "training loop's cost from the graph's); the baseline is always run.")
flags.DEFINE_float("reply_timeout", 900.0, "Seconds to wait for any one reply of a process.")
flags.DEFINE_float("time_limit", 3600.0, "Every process is killed after this many seconds.")
flags.DEFINE_string("process_log_dir", "",
                    "Process logs and train dirs; default a new temporary folder.")
flags.DEFINE_string("json_output", "", "If set, the raw step times and losses as JSON.")

BASELINE = "single_4"


class Config:
    """One configuration: its processes' roles and how to read its loss."""

    def __init__(self, key, label, role, workers, towers, ps=False, loss="first",
                 optional=False):
        self.key, self.label, self.role = key, label, role
        self.workers, self.towers, self.ps, self.loss = workers, towers, ps, loss
        self.optional = optional  # run only when --configs names it

    @property
    def replicas(self):
        return self.workers * self.towers


CONFIGS = [
    Config(BASELINE, "one process, 4 towers", "single", 1, 4),
    Config("allreduce_2x2", "towerlib all-reduce, 2 workers x 2 towers", "allreduce", 2, 2),
    Config("allreduce_2x2_flat", "towerlib all-reduce, 2 x 2, one flat group of 4 members",
           "allreduce_flat", 2, 2, optional=True),
    Config("ps_2x2", "towerlib parameter server, 1 ps + 2 workers x 2 towers", "ps_worker",
           2, 2, ps=True, loss="mean"),
    Config("allreduce_2x1", "towerlib all-reduce, 2 workers x 1 tower", "allreduce", 2, 1),
    Config("plain_2x1", "towerlib all-reduce graph, plain session loop, 2 x 1",
           "allreduce_plain", 2, 1, optional=True),
    Config("mwms_2x1", "MultiWorkerMirroredStrategy, 2 workers x 1 replica", "mwms", 2, 1,
           loss="sum"),
]
CONFIG_KEYS = [c.key for c in CONFIGS]
# The loss checks: (configuration, configuration it must agree with). Only
# configurations with the same replicas normalize batch norm over the same
# shards, so 2 x 1 is checked against 2 x 1 only.
# Ratios printed per repetition: (numerator, denominator, what the line says).
PAIR_RATIOS = [
    ("allreduce_2x2", "ps_2x2", "towerlib all-reduce / parameter server (2 x 2), per repetition"),
    ("mwms_2x1", "allreduce_2x1",
     "MultiWorkerMirroredStrategy / towerlib all-reduce (2 x 1), per repetition"),
    ("allreduce_2x2_flat", "allreduce_2x2",
     "one flat group of 4 / per-worker hubs (2 x 2), per repetition")]
LOSS_CHECKS = [("mwms_2x1", "allreduce_2x1"), ("allreduce_2x2", BASELINE),
               ("allreduce_2x2_flat", BASELINE),
               ("ps_2x2", BASELINE), ("plain_2x1", "allreduce_2x1")]

def median_range(values):
    return statistics.median(values), min(values), max(values)


def measure(configs, common, log_dir, warmup, repeats, steps, segment_warmup,
            reply_timeout, tolerance, progress):
    """Starts, checks and times every configuration; returns the results dict."""
    running = {}
    try:
        for config in configs:
            started = time.perf_counter()
            running[config.key] = run = processes.start_config(config, common, log_dir)
            ready = [proc.receive(reply_timeout) for proc in run.workers]
            progress(f"{config.key}: ready in {time.perf_counter() - started:.1f} s "
                     f"(graph built in {max(r['build_seconds'] for r in ready):.1f} s)")

        losses = {}
        for config in configs:
            _, _, losses[config.key], _ = running[config.key].run(warmup, reply_timeout)
        checks = loss_checks(losses, tolerance)
        for line in checks["lines"]:
            progress(line)
        if not checks["ok"]:
            return {"losses": losses, "checks": checks, "samples": None}

        samples = {c.key: [] for c in configs}
        for repeat in range(repeats):
            for config in configs:
                seconds, run_seconds, _, cpu = running[config.key].run(
                    segment_warmup + steps, reply_timeout)
                samples[config.key].append(
                    {"seconds": seconds[segment_warmup:],
                     "run_seconds": run_seconds[segment_warmup:],
                     "cpu_per_step": cpu / (segment_warmup + steps)})
            progress(f"repetition {repeat + 1}/{repeats}: " + ", ".join(
                f"{key} {statistics.median(s[-1]['seconds']):.3f}"
                for key, s in samples.items()))
        for run in running.values():
            for proc in run.all:
                proc.receive(reply_timeout)  # {"exited": true}
        return {"losses": losses, "checks": checks, "samples": samples}
    finally:
        for run in running.values():
            for proc in run.all:
                proc.kill()


def loss_checks(losses, tolerance):
    """The configurations' losses over the warm-up steps against each other."""
    lines, ok = [], True
    for key in losses:
        lines.append(f"loss, {key}: " + ", ".join(f"{v:.6f}" for v in losses[key]))
    for key, reference in LOSS_CHECKS:
        if key not in losses or reference not in losses:
            continue
        diff = max(abs(a - b) for a, b in zip(losses[key], losses[reference]))
        good = diff <= tolerance
        ok = ok and good
        lines.append(f"LOSS CHECK {key} vs {reference}: max |difference| over "
                     f"{len(losses[key])} steps from the same weights = {diff:.2e} "
                     f"({'within' if good else 'NOT within'} {tolerance:g})")
    return {"ok": ok, "lines": lines}


def summarize(configs, samples):
    """Rows {key, label, median, ratio, paired (median, low, high), run_median,
    run_ratio, cpu, cpu_ratio, steps}."""
    def segment_medians(key):
        return [statistics.median(s["seconds"]) for s in samples[key]]

    base_all = [t for s in samples[BASELINE] for t in s["seconds"]]
    base_median = statistics.median(base_all)
    base_segments = segment_medians(BASELINE)
    base_cpu = statistics.median(s["cpu_per_step"] for s in samples[BASELINE])
    base_run = statistics.median(t for s in samples[BASELINE] for t in s["run_seconds"])
    rows = []
    for config in configs:
        every = [t for s in samples[config.key] for t in s["seconds"]]
        paired = [a / b for a, b in zip(segment_medians(config.key), base_segments)]
        cpu = statistics.median(s["cpu_per_step"] for s in samples[config.key])
        run = statistics.median(t for s in samples[config.key] for t in s["run_seconds"])
        rows.append({"key": config.key, "label": config.label,
                     "median": statistics.median(every),
                     "ratio": statistics.median(every) / base_median,
                     "paired": median_range(paired), "run_median": run,
                     "run_ratio": run / base_run, "cpu": cpu, "cpu_ratio": cpu / base_cpu,
                     "steps": len(every)})
    return rows


def pair_line(samples, numerator, denominator, text):
    """Per-repetition ratio of two configurations' median steps, as one line."""
    if numerator not in samples or denominator not in samples:
        return None
    ratios = [statistics.median(a["seconds"]) / statistics.median(b["seconds"])
              for a, b in zip(samples[numerator], samples[denominator])]
    median, low, high = median_range(ratios)
    return f"{text}: {median:.3f} ({low:.3f}-{high:.3f}, n={len(ratios)})"


def table(rows):
    lines = ["| configuration | s/step (median) | / one process, 4 towers | "
             "per repetition, median (range) | session.run s/step | / one process | "
             "CPU s/step | / one process |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for row in rows:
        median, low, high = row["paired"]
        lines.append(f"| {row['label']} | {row['median']:.3f} | {row['ratio']:.3f} | "
                     f"{median:.3f} ({low:.3f}-{high:.3f}) | {row['run_median']:.3f} | "
                     f"{row['run_ratio']:.3f} | {row['cpu']:.2f} | "
                     f"{row['cpu_ratio']:.2f} |")
    return lines


def _load_average():
    return ", ".join(f"{v:.2f}" for v in os.getloadavg())


def main(argv):
    del argv
    keys = FLAGS.configs or [c.key for c in CONFIGS if not c.optional]
    unknown = set(keys) - set(CONFIG_KEYS)
    if unknown:
        raise app.UsageError(f"Unknown --configs {sorted(unknown)}; known: {CONFIG_KEYS}")
    configs = [c for c in CONFIGS if c.key == BASELINE or c.key in keys]
    for config in configs:
        if FLAGS.global_batch % config.replicas:
            raise app.UsageError(f"--global_batch={FLAGS.global_batch} does not split "
                                 f"evenly over {config.key}'s {config.replicas} replicas.")
    log_dir = FLAGS.process_log_dir or tempfile.mkdtemp(prefix="towerlib-multiworker-")
    os.makedirs(log_dir, exist_ok=True)
    total_steps = FLAGS.warmup_steps + FLAGS.repeats * (FLAGS.segment_warmup_steps
                                                        + FLAGS.steps)

    def progress(line):
        print(line, flush=True)

    # Every process is killed once the time limit is spent, whatever state it is in.
    def time_is_up():
        progress(f"TIME LIMIT of {FLAGS.time_limit:.0f} s reached: killing every process")
        for proc in list(processes.STARTED):
            proc.kill_group()
        os._exit(3)

    watchdog = threading.Timer(FLAGS.time_limit, time_is_up)
    watchdog.daemon = True
    watchdog.start()

    started = time.perf_counter()
    progress("command: python -m bench.bench_multiworker "
             + " ".join(shlex.quote(a) for a in sys.argv[1:]))
    progress(f"logs: {log_dir}; load average at start {_load_average()}; "
             f"{os.cpu_count()} cores")
    weights_path = os.path.join(log_dir, f"{FLAGS.model}-initial.npz")
    summary = coordinator.prepare_weights(FLAGS.model, weights_path, FLAGS.seed,
                                          os.path.join(log_dir, "prepare.log"),
                                          FLAGS.reply_timeout)
    progress(f"{FLAGS.model}: {summary['num_weights']} weights, TensorFlow "
             f"{summary['tf_version']}; global batch {FLAGS.global_batch}; Momentum "
             f"lr={FLAGS.learning_rate}; {FLAGS.warmup_steps} warm-up steps, then "
             f"{FLAGS.repeats} repetitions x ({FLAGS.segment_warmup_steps} untimed + "
             f"{FLAGS.steps} timed) steps per configuration")
    common = dict(model=FLAGS.model, weights_path=weights_path,
                  global_batch=FLAGS.global_batch, seed=FLAGS.seed,
                  learning_rate=FLAGS.learning_rate, max_steps=total_steps,
                  startup_timeout_secs=FLAGS.reply_timeout,
                  step_deadline_secs=FLAGS.reply_timeout,
                  ps_timeout_secs=FLAGS.time_limit)
    results = measure(configs, common, log_dir, FLAGS.warmup_steps, FLAGS.repeats,
                      FLAGS.steps, FLAGS.segment_warmup_steps, FLAGS.reply_timeout,
                      FLAGS.loss_tolerance, progress)
    if FLAGS.json_output:
        with open(FLAGS.json_output, "w") as output:
            json.dump(dict(results, flags={k: getattr(FLAGS, k) for k in (
                "model", "global_batch", "repeats", "steps", "segment_warmup_steps",
                "warmup_steps", "learning_rate", "seed")}), output, indent=1)
    if results["samples"] is None:
        progress("The loss check failed: nothing was timed.")
        return 1
    samples = results["samples"]
    for line in table(summarize(configs, samples)):
        progress(line)
    for numerator, denominator, text in PAIR_RATIOS:
        line = pair_line(samples, numerator, denominator, text)
        if line:
            progress(line)
    progress(f"load average at end {_load_average()}; "
             f"{time.perf_counter() - started:.0f} s in all")
    return 0


if __name__ == "__main__":
    app.run(main)

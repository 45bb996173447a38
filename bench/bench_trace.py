"""What tracing costs: a traced step against an untraced one, and
run_training with trace_steps that are never reached against run_training without.

    python bench/bench_trace.py --towers=4 --model=resnet20 --repetitions=15

Two comparisons, each measured side by side in one interleaved run
(bench/stepped.interleaved_samples: every repetition times each variant once,
in an order rotated by one each repetition, so that load from other processes
spreads over the variants instead of landing on one):

(a) traced / untraced step. One training graph on T towers (virtual CPU
    devices unless GPUs are present) in one Session, stepped two ways: plainly,
    and with RunOptions(trace_level=FULL_TRACE) into a RunMetadata followed by
    towerlib.trace.analyze_step on it (what TraceHook does for a chosen step,
    less writing the files). Same graph, same session: the only difference is
    the tracing. With --trace_steps_per_repetition=1 (the default) the two
    alternate step by step.

(b) run_training with trace_steps=[a step never reached] / without. Two
    identical graphs, each trained by towerlib.run_training itself, in its own
    thread, one of them with trace_steps=[FAR_STEP]: its loop carries the
    TraceHook run_training adds (a fetch of global_step with every run, no
    trace). A hook of this benchmark's, the gate, lets each loop run the steps
    asked for and then waits: the threads take turns, never run at once, and
    a segment of n steps is timed from the gate's before_run of its first step
    to its before_run of the step after the last, i.e. exactly n whole
    iterations of run_training's loop with every hook. A third loop, again
    without trace_steps (--control), is the A/A control: its ratio to the first
    says how small a difference this run can tell from noise. Checkpoints are
    written only when each loop starts and stops (outside the timing);
    summaries and log lines as run_training's defaults.

Reported for each ratio: the median seconds per step of both sides, the ratio
of medians (wall clock and process CPU time), and the median and middle half
(25th-75th percentile) of the paired ratios, each repetition's numerator over
the same repetition's denominator. The target asks that (b) cost nothing
measurable; bench/targets.py UNREACHED_TRACE_HOOK holds the lower quartile of
its paired ratios to 1.00 (the middle half reaches 1.00).

The model is the CIFAR example's (examples/cifar10/models.py), ResNet-20 by
default; data are random constants: only the time matters.

Not a test: numbers depend on the machine and on whatever else it runs.
"""

import os
import queue
import shutil
import statistics
import sys
import tempfile
import threading
import time

from absl import app, flags

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import towerlib  # noqa: E402
import towerlib.trace  # noqa: E402
from bench import targets  # noqa: E402
from bench.stepped import SteppedGraph, interleaved_samples  # noqa: E402
from examples.cifar10.models import make_model  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_integer("towers", 4, "Towers (virtual CPU devices unless GPUs are present).")
flags.DEFINE_string("model", "resnet20", "A model of examples/cifar10/models.py.")
flags.DEFINE_integer("global_batch", 128, "Examples per step, over all towers.")
flags.DEFINE_integer("warmup_steps", 3, "Untimed steps per variant first.")
flags.DEFINE_integer("repetitions", 15, "Interleaved timed repetitions of each comparison.")
flags.DEFINE_integer("trace_steps_per_repetition", 1,
                     "(a): steps timed per variant per repetition (1: alternate step by step).")
flags.DEFINE_integer("loop_steps_per_repetition", 4,
                     "(b): run_training steps timed per variant per repetition.")
flags.DEFINE_bool("control", True, "(b): also time a second loop without trace_steps "
                  "(the A/A control).")
flags.DEFINE_list("parts", ["traced", "loop"], "Which comparisons: traced (a), loop (b).")

# A global step no run reaches: run_training(trace_steps=[FAR_STEP]).
FAR_STEP = 10 ** 9
UNTRACED, TRACED = "untraced step", "traced step"
NO_TRACE, UNREACHED, CONTROL = ("run_training", "run_training, trace_steps=[far]",
                                "run_training (second copy)")


def _build(num_towers):
    """(graph, TrainGraph) of the model on `num_towers` towers, random constant data."""
    graph = tf.Graph()
    rng = np.random.RandomState(0)
    with graph.as_default():
        images = tf.constant(rng.rand(FLAGS.global_batch, 32, 32, 3).astype(np.float32))
        labels = tf.constant(rng.randint(0, 10, FLAGS.global_batch).astype(np.int32))
        train = towerlib.build_train_graph(
            make_model(FLAGS.model), (images, labels),
            tf.compat.v1.train.MomentumOptimizer(0.1, 0.9), num_towers=num_towers,
            summaries=False)
    return graph, train


# --- (a) a traced step against an untraced one, same session -------------------------------


class PlainStep(SteppedGraph):
    """The training graph in its own Session, stepped without tracing."""

    name = UNTRACED

    def __init__(self, num_towers):
        self.graph, train = _build(num_towers)
        self.train_op = train.train_op
        self.devices = train.devices
        with self.graph.as_default():
            self.session = tf.compat.v1.Session(config=towerlib.session_config(num_towers))
            self.session.run(tf.compat.v1.global_variables_initializer())


class TracedStep(SteppedGraph):
    """PlainStep's graph and Session, each step traced and analyzed.

    Attributes:
      analysis_seconds: wall seconds of each analyze_step call (part of the
        step's time here).
      events: op executions recorded in the last traced step.
      last_summary: the last StepProfile's summary line.
    """

    name = TRACED

    def __init__(self, plain: PlainStep):
        self.graph, self.session, self.train_op = plain.graph, plain.session, plain.train_op
        self.devices = plain.devices
        self.options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
        self.analysis_seconds = []
        self.events = 0
        self.last_summary = ""

    def seconds_per_step(self, steps):
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(steps):
            metadata = tf.compat.v1.RunMetadata()
            self.session.run(self.train_op, options=self.options, run_metadata=metadata)
            start = time.perf_counter()
            profile = towerlib.trace.analyze_step(metadata, self.devices)
            self.analysis_seconds.append(time.perf_counter() - start)
        self.events = sum(len(d.node_stats) for d in metadata.step_stats.dev_stats)
        self.last_summary = profile.summary_line()
        return ((time.perf_counter() - wall) / steps, (time.process_time() - cpu) / steps)


# --- (b) run_training with and without an unreached trace step -----------------------------


class _Gate(tf.compat.v1.train.SessionRunHook):
    """Runs the steps asked for through `requests`, then reports their times and waits.

    A request is a step count, or None to stop. The time of a segment of n
    steps runs from this hook's before_run of its first step to its
    before_run of the step after the last: n whole loop iterations, every
    other hook's work included.
    """

    def __init__(self, requests, results):
        self._requests, self._results = requests, results
        self._left = 0
        self._started = None

    def before_run(self, run_context):
        if self._left == 0:
            if self._started is not None:
                self._results.put((time.perf_counter() - self._started[0],
                                   time.process_time() - self._started[1]))
                self._started = None
            steps = self._requests.get()
            if steps is None:
                run_context.request_stop()  # this last run still happens, untimed
                self._left = -1
                return
            self._left = steps
            self._started = (time.perf_counter(), time.process_time())
        self._left -= 1


class TrainingLoop:
    """towerlib.run_training on its own graph, in its own thread, stepped on request.

    Has SteppedGraph's interface (seconds_per_step, close), so that
    interleaved_samples can take turns between loops.
    """

    _DONE = object()

    def __init__(self, name, num_towers, trace_steps=()):
        self.name = name
        self.train_dir = tempfile.mkdtemp(prefix="bench-trace-")
        self._graph, self._train = _build(num_towers)
        self._num_towers = num_towers
        self._trace_steps = list(trace_steps)
        self._requests, self._results = queue.Queue(), queue.Queue()
        self._error = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self):
        try:
            # As callers do (examples/cifar10/train.py): outside a graph context a
            # thread is eager, and run_training's summary writer refuses eager mode.
            with self._graph.as_default():
                towerlib.run_training(
                    self._train, train_dir=self.train_dir, max_steps=2 * FAR_STEP,
                    hooks=[_Gate(self._requests, self._results)],
                    session_config=towerlib.session_config(self._num_towers),
                    save_checkpoint_steps=FAR_STEP, trace_steps=self._trace_steps,
                    stop_on_signals=())  # signal handlers belong to the main thread
        except BaseException as error:  # reported by the next seconds_per_step
            self._error = error
        finally:
            self._results.put(self._DONE)

    def seconds_per_step(self, steps):
        self._requests.put(steps)
        result = self._results.get()
        if result is self._DONE:
            raise RuntimeError(f"{self.name}: run_training ended early: {self._error!r}")
        wall, cpu = result
        return wall / steps, cpu / steps

    def close(self):
        if self._thread.is_alive():
            self._requests.put(None)
            self._thread.join(timeout=600)
        shutil.rmtree(self.train_dir, ignore_errors=True)


# --- statistics and the table --------------------------------------------------------------


def quartiles(values):
    """(q1, median, q3) of `values`; the one value thrice when there is one."""
    if len(values) < 2:
        return values[0], values[0], values[0]
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, median, q3


def comparison_row(label, samples, numerator, denominator):
    """(table cells, paired quartiles) of `numerator` over `denominator`."""
    def median(name, which):
        return statistics.median(t[which] for t in samples[name])

    paired = [n[0] / d[0] for n, d in zip(samples[numerator], samples[denominator])]
    q1, middle, q3 = quartiles(paired)
    cells = [label, f"{median(numerator, 0):.4f}", f"{median(denominator, 0):.4f}",
             f"{median(numerator, 0) / median(denominator, 0):.3f}x",
             f"{middle:.3f} ({q1:.3f}-{q3:.3f})",
             f"{median(numerator, 1) / median(denominator, 1):.3f}x", str(len(paired))]
    return cells, (q1, middle, q3)


HEADER = ["ratio", "numerator s/step", "denominator s/step", "ratio of medians",
          "paired ratio: median (middle half)", "CPU time, ratio of medians", "repetitions"]


def measure_traced(num_towers):
    """(a): table rows and notes."""
    plain = PlainStep(num_towers)
    traced = TracedStep(plain)
    samples = interleaved_samples([plain, traced], lambda run: run.name, FLAGS.warmup_steps,
                                  FLAGS.repetitions, FLAGS.trace_steps_per_repetition)
    row, _ = comparison_row("traced / untraced step (FULL_TRACE + analyze_step)",
                            samples, TRACED, UNTRACED)
    analysis = statistics.median(traced.analysis_seconds)
    traced_step = statistics.median(t[0] for t in samples[TRACED])
    notes = [f"analyze_step: median {1000 * analysis:.1f} ms per traced step "
             f"({100 * analysis / traced_step:.0f}% of the traced step's time), "
             f"{traced.events} op executions recorded in the last traced step",
             f"last traced step: {traced.last_summary}"]
    return [row], notes


def measure_loop(num_towers):
    """(b): table rows and notes."""
    loops = [TrainingLoop(NO_TRACE, num_towers),
             TrainingLoop(UNREACHED, num_towers, trace_steps=[FAR_STEP])]
    if FLAGS.control:
        loops.append(TrainingLoop(CONTROL, num_towers))
    samples = interleaved_samples(loops, lambda run: run.name, FLAGS.warmup_steps,
                                  FLAGS.repetitions, FLAGS.loop_steps_per_repetition)
    row, (q1, _, _) = comparison_row(
        "run_training with trace_steps=[never reached] / without", samples, UNREACHED,
        NO_TRACE)
    rows = [row]
    if FLAGS.control:
        rows.append(comparison_row("control: run_training without / without (second copy)",
                                   samples, CONTROL, NO_TRACE)[0])
    return rows, [targets.UNREACHED_TRACE_HOOK.verdict_line(q1)]


def main(argv):
    del argv
    device_kind = towerlib.tower_devices(1)[0].split(":")[-2].split("/")[-1]
    print(f"CIFAR {FLAGS.model}, {FLAGS.towers} towers on {device_kind} devices, global "
          f"batch {FLAGS.global_batch}, bn_mode=first_tower, Momentum, {os.cpu_count()} "
          f"cores; {FLAGS.repetitions} interleaved repetitions x "
          f"{FLAGS.trace_steps_per_repetition} step(s) (traced) and "
          f"{FLAGS.loop_steps_per_repetition} step(s) (run_training), after "
          f"{FLAGS.warmup_steps} warm-up steps; load average at start "
          f"{os.getloadavg()[0]:.1f}", flush=True)
    rows, notes = [], []
    for part, measure in (("traced", measure_traced), ("loop", measure_loop)):
        if part in FLAGS.parts:
            part_rows, part_notes = measure(FLAGS.towers)
            rows += part_rows
            notes += part_notes
    print("| " + " | ".join(HEADER) + " |")
    print("| --- |" + " ---: |" * (len(HEADER) - 1))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print(f"load average at end {os.getloadavg()[0]:.1f}")
    for note in notes:
        print(note)


if __name__ == "__main__":
    app.run(main)

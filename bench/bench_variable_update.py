"""Step time of update='replicated' against 'parameter_server'.

    python bench/bench_variable_update.py --towers=1,2,4,8 --repetitions=9

The question: does a copy of every variable per tower, with the
gradients all-reduced, cost more per step than one copy on the host CPU
(target, bench/targets.py REPLICATED: replicated <= 1.05x the
parameter-server step time at 8 towers on virtual CPU towers; a line after the
table says whether this run met it)? And which all-reduce transport should be the default
on CPU towers: graph edges ('graph') or collective ops ('collective')?

Variants, each its own graph and Session on virtual CPU devices (GPUs when
present), all with bn_mode='first_tower' and Momentum:

  parameter_server       one copy of every variable on the host CPU (the baseline)
  replicated/graph       replicated, gradients packed into buffers of
                         DEFAULT_PACK_BYTES, graph transport
  replicated/graph/unpacked   the same with gradient_pack_bytes=0
  replicated/collective  replicated, packed, collective transport: measured
                         only at the --transport_towers counts

At each tower count every variant is built, warmed up, then timed in
interleaved repetitions: a repetition times each variant once, in an order
rotated by one each repetition, so that load from other processes spreads
over the variants instead of landing on one. Reported: median seconds per
step, the ratio of medians to parameter_server (wall clock and CPU time), and
the median and middle half (25th-75th percentile) of the paired ratios (a
variant's time in a repetition over parameter_server's in the same
repetition). The transport line compares collective with graph the same
paired way. A wide middle half says the run was disturbed.

The model is the CIFAR example's (examples/cifar10/models.py), ResNet-20 by
default; data are random constants: only the time matters.

Not a test: numbers depend on the machine and on whatever else it runs.
"""

import os
import statistics
import sys
import time

from absl import app, flags

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import towerlib  # noqa: E402
from bench import targets  # noqa: E402
from bench.stepped import SteppedGraph, interleaved_samples  # noqa: E402
from examples.cifar10.models import make_model  # noqa: E402
from towerlib.update.replicated import DEFAULT_PACK_BYTES  # noqa: E402

BASELINE = "parameter_server"
GRAPH = "replicated/graph"
COLLECTIVE = "replicated/collective"

# build_train_graph options of each variant.
VARIANTS = {
    BASELINE: dict(update="parameter_server"),
    GRAPH: dict(update=towerlib.Replicated(), exchange="graph"),
    "replicated/graph/unpacked": dict(update=towerlib.Replicated(pack_bytes=0),
                                      exchange="graph"),
    COLLECTIVE: dict(update=towerlib.Replicated(), exchange="collective"),
}

FLAGS = flags.FLAGS
flags.DEFINE_list("towers", ["1", "2", "4", "8"], "Tower counts to measure.")
flags.DEFINE_list("transport_towers", ["8"],
                  f"Tower counts at which {COLLECTIVE} is measured too.")
flags.DEFINE_integer("global_batch", 128, "Examples per step, over all towers.")
flags.DEFINE_integer("warmup_steps", 3, "Untimed steps per graph first.")
flags.DEFINE_integer("repetitions", 9, "Interleaved timed repetitions.")
flags.DEFINE_integer("steps_per_repetition", 3, "Steps timed per repetition.")
flags.DEFINE_string("model", "resnet20", "A model of examples/cifar10/models.py.")


class VariantRun(SteppedGraph):
    """One variant's training graph and Session, ready to be stepped."""

    def __init__(self, num_towers, variant):
        self.variant = variant
        self.graph = tf.Graph()
        rng = np.random.RandomState(0)
        with self.graph.as_default():
            images = tf.constant(rng.rand(FLAGS.global_batch, 32, 32, 3).astype(np.float32))
            labels = tf.constant(rng.randint(0, 10, FLAGS.global_batch).astype(np.int32))
            start = time.perf_counter()
            train = towerlib.build_train_graph(
                make_model(FLAGS.model),
                (images, labels),
                tf.compat.v1.train.MomentumOptimizer(0.1, 0.9),
                num_towers=num_towers,
                summaries=False,
                **VARIANTS[variant],
            )
            self.build_seconds = time.perf_counter() - start
            self.train_op = train.train_op
            self.session = tf.compat.v1.Session(config=towerlib.session_config(num_towers))
            self.session.run(tf.compat.v1.global_variables_initializer())
            # The other towers' copies are local variables that read tower 0's.
            self.session.run(tf.compat.v1.local_variables_initializer())
            self.collectives = self.count_collectives()


def variants_at(num_towers):
    """The variants measured at `num_towers`, the baseline first."""
    names = [BASELINE, GRAPH, "replicated/graph/unpacked"]
    if str(num_towers) in FLAGS.transport_towers:
        names.append(COLLECTIVE)
    return names


def measure(num_towers):
    """{variant: [(wall, cpu) seconds per step, one per repetition]}, and build info."""
    runs = [VariantRun(num_towers, variant) for variant in variants_at(num_towers)]
    collectives = {run.variant: run.collectives for run in runs}
    samples = interleaved_samples(runs, lambda run: run.variant, FLAGS.warmup_steps,
                                  FLAGS.repetitions, FLAGS.steps_per_repetition)
    return samples, collectives


def paired_ratios(samples, numerator, denominator):
    """Each repetition's wall time of `numerator` over `denominator`'s, same repetition."""
    return [n[0] / d[0] for n, d in zip(samples[numerator], samples[denominator])]


def paired_summary(values):
    """'median (q1-q3)' of per-repetition ratios, or the one value.

    The median of paired ratios is steadier than a ratio of medians: a
    repetition slowed by outside load slows both of its terms.
    """
    if len(values) < 2:
        return f"{values[0]:.3f}"
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return f"{median:.3f} ({q1:.3f}-{q3:.3f})"


def median_of(samples, variant, which):
    return statistics.median(t[which] for t in samples[variant])


def main(argv):
    del argv
    device_kind = towerlib.tower_devices(1)[0].split(":")[-2].split("/")[-1]
    print(
        f"CIFAR {FLAGS.model}, global batch {FLAGS.global_batch}, bn_mode=first_tower, "
        f"Momentum, towers on {device_kind} devices, {os.cpu_count()} cores; "
        f"DEFAULT_PACK_BYTES={DEFAULT_PACK_BYTES}; median of "
        f"{FLAGS.repetitions} interleaved repetitions x {FLAGS.steps_per_repetition} "
        f"steps; load average at start {os.getloadavg()[0]:.1f}"
    )
    print("| towers | variant | s/step | / parameter_server | / parameter_server "
          "(CPU time) | / parameter_server per repetition, median (middle half) | "
          "collective ops |")
    print("|" + " --- |" * 7)
    transport_lines, verdicts = [], []
    for num_towers in (int(t) for t in FLAGS.towers):
        samples, collectives = measure(num_towers)
        if targets.REPLICATED.applies_to(num_towers):
            verdicts.append(f"{num_towers} towers, {GRAPH}: " + targets.REPLICATED.verdict_line(
                statistics.median(paired_ratios(samples, GRAPH, BASELINE))))
        base_wall = median_of(samples, BASELINE, 0)
        base_cpu = median_of(samples, BASELINE, 1)
        for variant in samples:
            wall, cpu = median_of(samples, variant, 0), median_of(samples, variant, 1)
            paired = ("1 (baseline)" if variant == BASELINE
                      else paired_summary(paired_ratios(samples, variant, BASELINE)))
            print(f"| {num_towers} | {variant} | {wall:.3f} | {wall / base_wall:.3f}x | "
                  f"{cpu / base_cpu:.3f}x | {paired} | {collectives[variant]} |", flush=True)
        if COLLECTIVE in samples:
            ratios = paired_ratios(samples, COLLECTIVE, GRAPH)
            faster = "graph" if statistics.median(ratios) > 1 else "collective"
            transport_lines.append(
                f"  {num_towers} towers: collective / graph step time, per repetition: "
                f"{paired_summary(ratios)} -> {faster} is faster")
    print(f"load average at end {os.getloadavg()[0]:.1f}")
    for line in verdicts:
        print(line)
    if transport_lines:
        print(f"TRANSPORT for replicated on {device_kind} towers (decides the default):")
        print("\n".join(transport_lines))


if __name__ == "__main__":
    app.run(main)

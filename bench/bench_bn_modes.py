"""Step time of the three batch-norm modes on a CIFAR ResNet-20.

    python bench/bench_bn_modes.py --towers=2,4,8 --repetitions=15

For each tower count, one training graph per mode is built (each in its
own graph and Session, on virtual CPU devices unless GPUs are present), warmed
up, then timed in interleaved repetitions: every repetition times each mode
once, in a rotating order, so that load from other processes on the machine
spreads over the modes instead of landing on one. 'sync' runs with the
default transport for the devices (graph edges on CPUs) and 'sync/collective'
through collective ops. Reports the median seconds per step of each mode,
its ratio to first_tower (by wall clock and by CPU time), and the median and
middle half (25th to 75th percentile) of the paired ratios, each
repetition's mode time over the same repetition's first_tower time: a wide
spread, or all_towers far from 1.00x, says the run was disturbed.
At the tower counts where sync has a target (bench/targets.py:
SYNC_BATCH_NORM, <= 1.15x first_tower's step time at 8 towers), a last line
says whether this run met it.

The model is the CIFAR example's (examples/cifar10/models.py): ResNet-20 by
default (He et al. 2016, CIFAR variant: 3 stages of 3 basic blocks, 16/32/64
channels, 21 batch-norm layers counting the projection shortcuts). Data are
random: only the time matters.

Not a test: numbers depend on the machine and on whatever else it runs.
"""

import os
import statistics
import sys

from absl import app, flags

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import towerlib  # noqa: E402
from bench import targets  # noqa: E402
from bench.stepped import SteppedGraph, interleaved_samples  # noqa: E402
from examples.cifar10.models import make_model  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_list("towers", ["2", "4", "8"], "Tower counts to measure.")
flags.DEFINE_list(
    "modes",
    ["first_tower", "all_towers", "sync", "sync/collective"],
    "Batch-norm modes; the first is the ratios' baseline. 'sync/T' is sync "
    "with sync_transport T ('graph' or 'collective'); plain 'sync' takes the "
    "default transport for the devices.",
)
flags.DEFINE_integer("global_batch", 128, "Examples per step, over all towers.")
flags.DEFINE_integer("warmup_steps", 3, "Untimed steps per graph first.")
flags.DEFINE_integer("repetitions", 15, "Interleaved timed repetitions.")
flags.DEFINE_integer("steps_per_repetition", 4, "Steps timed per repetition.")
flags.DEFINE_enum("param_device", "cpu", ["cpu", "gpu"], "Where variables live.")
flags.DEFINE_string("model", "resnet20", "A model of examples/cifar10/models.py.")


class ModeRun(SteppedGraph):
    """One bn_mode's training graph and Session, ready to be stepped."""

    def __init__(self, num_towers, mode):
        self.mode = mode
        bn_mode, _, transport = mode.partition("/")
        self.graph = tf.Graph()
        rng = np.random.RandomState(0)
        with self.graph.as_default():
            images = tf.constant(rng.rand(FLAGS.global_batch, 32, 32, 3).astype(np.float32))
            labels = tf.constant(rng.randint(0, 10, FLAGS.global_batch).astype(np.int32))
            train = towerlib.build_train_graph(
                make_model(FLAGS.model),
                (images, labels),
                tf.compat.v1.train.MomentumOptimizer(0.1, 0.9),
                num_towers=num_towers,
                bn_mode=bn_mode,
                exchange=transport or None,
                update=towerlib.ParameterServer(device=FLAGS.param_device),
                summaries=False,
            )
            self.train_op = train.train_op
            self.session = tf.compat.v1.Session(config=towerlib.session_config(num_towers))
            self.session.run(tf.compat.v1.global_variables_initializer())
            self.collectives = self.count_collectives()


def measure(num_towers):
    """Median seconds per step of each mode at `num_towers`."""
    runs = [ModeRun(num_towers, mode) for mode in FLAGS.modes]
    collectives = {run.mode: run.collectives for run in runs}
    samples = interleaved_samples(runs, lambda run: run.mode, FLAGS.warmup_steps,
                                  FLAGS.repetitions, FLAGS.steps_per_repetition)
    wall = {m: statistics.median(t[0] for t in times) for m, times in samples.items()}
    cpu = {m: statistics.median(t[1] for t in times) for m, times in samples.items()}
    baseline = samples[FLAGS.modes[0]]
    paired = {
        m: [t[0] / b[0] for t, b in zip(times, baseline)] for m, times in samples.items()
    }
    return wall, cpu, collectives, paired


def paired_summary(values):
    """'median (q1-q3)' of per-repetition ratios, or the one value.

    The median of paired ratios is steadier than a ratio of medians: a
    repetition slowed by outside load slows both of its terms.
    """
    if len(values) < 2:
        return f"{values[0]:.2f}"
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return f"{median:.2f} ({q1:.2f}-{q3:.2f})"


def main(argv):
    del argv
    baseline = FLAGS.modes[0]
    print(
        f"CIFAR {FLAGS.model}, global batch "
        f"{FLAGS.global_batch}, param_device={FLAGS.param_device}, towers on "
        f"{towerlib.tower_devices(1)[0].split(':')[-2].split('/')[-1]} "
        f"devices, {os.cpu_count()} cores; median of {FLAGS.repetitions} "
        f"interleaved repetitions x {FLAGS.steps_per_repetition} steps; load "
        f"average at start {os.getloadavg()[0]:.1f}"
    )
    header = (
        "| towers | "
        + " | ".join(f"{m} s/step" for m in FLAGS.modes)
        + " | "
        + " | ".join(f"{m} / {baseline}" for m in FLAGS.modes[1:])
        + " | "
        + " | ".join(f"{m} / {baseline} (CPU time)" for m in FLAGS.modes[1:])
        + " | "
        + " | ".join(f"{m} / {baseline} per repetition, median (middle half)"
                     for m in FLAGS.modes[1:])
        + " | collective ops per step |"
    )
    print(header)
    print("|" + " --- |" * (header.count("|") - 1))
    verdicts = []
    target = targets.SYNC_BATCH_NORM
    for num_towers in (int(t) for t in FLAGS.towers):
        wall, cpu, collectives, paired = measure(num_towers)
        if target.applies_to(num_towers) and baseline == "first_tower" and "sync" in wall:
            verdicts.append(f"{num_towers} towers: "
                            + target.verdict_line(wall["sync"] / wall[baseline]))
        cells = [f"{wall[m]:.3f}" for m in FLAGS.modes]
        cells += [f"{wall[m] / wall[baseline]:.2f}x" for m in FLAGS.modes[1:]]
        cells += [f"{cpu[m] / cpu[baseline]:.2f}x" for m in FLAGS.modes[1:]]
        cells += [paired_summary(paired[m]) for m in FLAGS.modes[1:]]
        cells.append(", ".join(f"{m}: {n}" for m, n in collectives.items() if n) or "0")
        print(f"| {num_towers} | " + " | ".join(cells) + " |", flush=True)
    print(f"load average at end {os.getloadavg()[0]:.1f}")
    for line in verdicts:
        print(line)


if __name__ == "__main__":
    app.run(main)

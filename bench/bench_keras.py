"""Step time of a tf_keras ResNet-20 through towerlib against the same network on towerlib.layers.

    python bench/bench_keras.py --towers=4 --repetitions=9

The question: does bringing a Keras model cost step time? The CIFAR
ResNet-20 of examples/cifar10/models.py (towerlib.layers, towerlib.batch_norm)
and examples/cifar10/keras_resnet.py (the same network in tf_keras layers,
through towerlib.KerasTower) are built side by side, each in its own graph and
Session, warmed up, then timed in interleaved repetitions (bench.stepped).
Target (bench/targets.py KERAS_MODEL): keras / towerlib.layers <= 1.05 at 4
towers. A model named 'name@bfloat16' is built with precision=bfloat16 (for
a Keras model: its mixed_bfloat16 policy) and also compared with 'name' in
float32. Data are random constants: only the time matters.

bfloat16 against float32, towerlib.layers and Keras in one interleaved run
(docs/precision.md, "When bfloat16 pays"; the header names the CPU's bfloat16 flags):

    flock /tmp/towerlib-bench.lock python bench/bench_keras.py --towers=4 \
        --models=resnet20,resnet20@bfloat16,keras_resnet20,keras_resnet20@bfloat16

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
import tf_keras  # noqa: E402,F401  (imported before any graph is built)

import towerlib  # noqa: E402
from bench import targets  # noqa: E402
from bench.stepped import SteppedGraph, interleaved_samples  # noqa: E402
from examples.cifar10.models import make_model  # noqa: E402
from towerlib.precision import cpu_units  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_list("towers", ["4"], "Tower counts to measure.")
flags.DEFINE_list("models", ["resnet20", "keras_resnet20", "keras_resnet20@bfloat16"],
                  "The baseline first; 'name@bfloat16' for a half precision.")
flags.DEFINE_string("bn_mode", "first_tower", "first_tower, all_towers or sync.")
flags.DEFINE_string("update", "parameter_server", "parameter_server or replicated.")
flags.DEFINE_integer("global_batch", 128, "Examples per step, over all towers.")
flags.DEFINE_integer("warmup_steps", 3, "Untimed steps per graph first.")
flags.DEFINE_integer("repetitions", 9, "Interleaved timed repetitions.")
flags.DEFINE_integer("steps_per_repetition", 3, "Steps timed per repetition.")


class ModelRun(SteppedGraph):
    """One model's training graph and Session, ready to be stepped."""

    def __init__(self, num_towers, model_spec):
        self.model_name = model_spec
        model_name, _, precision = model_spec.partition("@")
        self.graph = tf.Graph()
        rng = np.random.RandomState(0)
        with self.graph.as_default():
            images = tf.constant(rng.rand(FLAGS.global_batch, 32, 32, 3).astype(np.float32))
            labels = tf.constant(rng.randint(0, 10, FLAGS.global_batch).astype(np.int32))
            start = time.perf_counter()
            update = (towerlib.Replicated() if FLAGS.update == "replicated"
                      else towerlib.ParameterServer())
            train = towerlib.build_train_graph(
                make_model(model_name), (images, labels),
                tf.compat.v1.train.MomentumOptimizer(0.1, 0.9), num_towers=num_towers,
                bn_mode=FLAGS.bn_mode, update=update, summaries=False,
                precision=precision or "float32")
            self.build_seconds = time.perf_counter() - start
            self.train_op = train.train_op
            self.nodes = len(self.graph.as_graph_def().node)
            self.session = tf.compat.v1.Session(config=towerlib.session_config(num_towers))
            self.session.run(tf.compat.v1.global_variables_initializer())
            self.session.run(tf.compat.v1.local_variables_initializer())


def paired(samples, numerator, denominator):
    return [n[0] / d[0] for n, d in zip(samples[numerator], samples[denominator])]


def main(argv):
    del argv
    baseline = FLAGS.models[0]
    print(f"CIFAR ResNet-20, global batch {FLAGS.global_batch}, bn_mode={FLAGS.bn_mode}, "
          f"update={FLAGS.update}, Momentum, {os.cpu_count()} cores; median of "
          f"{FLAGS.repetitions} interleaved repetitions x {FLAGS.steps_per_repetition} "
          f"steps; load average at start {os.getloadavg()[0]:.1f}")
    flags = cpu_units.cpu_flags()
    print("CPU bfloat16 flags: " + ("unknown (no /proc/cpuinfo)" if flags is None else
                                    " ".join(sorted(flags & cpu_units.BFLOAT16_FLAGS))
                                    or "none"))
    print(f"| towers | model | s/step | / {baseline} | / {baseline} per repetition, median "
          "(middle half) | build s | graph nodes |")
    print("|" + " --- |" * 7)
    verdicts = []
    for num_towers in (int(t) for t in FLAGS.towers):
        runs = [ModelRun(num_towers, name) for name in FLAGS.models]
        samples = interleaved_samples(runs, lambda run: run.model_name, FLAGS.warmup_steps,
                                      FLAGS.repetitions, FLAGS.steps_per_repetition)
        base = statistics.median(t[0] for t in samples[baseline])
        for run in runs:
            wall = statistics.median(t[0] for t in samples[run.model_name])
            ratios = paired(samples, run.model_name, baseline)
            q1, median, q3 = (statistics.quantiles(ratios, n=4, method="inclusive")
                              if len(ratios) > 1 else (ratios[0],) * 3)
            print(f"| {num_towers} | {run.model_name} | {wall:.3f} | {wall / base:.3f}x | "
                  f"{median:.3f} ({q1:.3f}-{q3:.3f}) | {run.build_seconds:.1f} | "
                  f"{run.nodes} |", flush=True)
            full = run.model_name.partition("@")[0]
            if "@" in run.model_name and full in samples:
                half = statistics.median(paired(samples, run.model_name, full))
                verdicts.append(f"{num_towers} towers: {run.model_name} / {full} step time "
                                f"{half:.3f} (median of paired repetitions)")
            elif run.model_name != baseline and targets.KERAS_MODEL.applies_to(num_towers):
                verdicts.append(f"{num_towers} towers: "
                                + targets.KERAS_MODEL.verdict_line(median))
    print(f"load average at end {os.getloadavg()[0]:.1f}")
    print("\n".join(verdicts))


if __name__ == "__main__":
    app.run(main)

"""Peak memory of gradient accumulation, and step time of bfloat16, on this CPU.

    python bench/bench_precision_memory.py --repetitions=3

Memory: global batch 512 on one tower of the CIFAR example's ResNet-20, as
one batch of 512 (k = 1) and as k = 4 micro-batches of 128. Each
measurement runs in a fresh process (a process's peak resident set only
grows), in alternating order over the repetitions. The process builds the
graph, initializes it and runs one step of a tiny batch (the TensorFlow
runtime, the weights and the slots: the baseline), then records its peak
resident set size (ru_maxrss) after `--steps` steps of the real batch; the
difference is the step's own memory, mostly activations. Reported: each
configuration's median, and k = 4's over k = 1's.

Speed: bfloat16 against float32 step time (global batch 128 on 2 towers),
both graphs in one process, timed in interleaved repetitions; the median of
the paired per-repetition ratios. This CPU reports AVX512_BF16; whether
TensorFlow's CPU kernels use it for these convolutions is what the number
says, whichever way.

Not a test: numbers depend on the machine and on whatever else it runs.
"""

import json
import os
import resource
import statistics
import subprocess
import sys
import time

from absl import app, flags

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench import targets  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_integer("repetitions", 3, "Fresh-process memory measurements per setting.")
flags.DEFINE_integer("steps", 3, "Steps of the real batch per memory measurement.")
flags.DEFINE_integer("global_batch", 512, "Examples per step for the memory part.")
flags.DEFINE_integer("accumulation_steps", targets.ACCUMULATION_STEPS,
                     "k compared with one batch.")
flags.DEFINE_integer("speed_repetitions", 9,
                     "Interleaved repetitions of the speed part (0: memory only).")
flags.DEFINE_integer("speed_batch", 128, "Global batch of the speed part (2 towers).")
flags.DEFINE_string("model", "resnet20", "A model of examples/cifar10/models.py.")
flags.DEFINE_string("measure_memory", "", "Internal: run one memory measurement "
                    "with this accumulation_steps and print JSON.")


def _graph(global_batch, accumulation_steps, num_towers=1, precision="float32"):
    """(train graph, initialized Session, (images, labels) placeholders); call in a graph."""
    import numpy as np
    import tensorflow as tf

    import towerlib
    from examples.cifar10.models import make_model

    rng = np.random.RandomState(0)
    batch = tf.compat.v1.placeholder_with_default(
        rng.rand(global_batch, 32, 32, 3).astype(np.float32), [None, 32, 32, 3])
    labels = tf.compat.v1.placeholder_with_default(
        rng.randint(0, 10, global_batch).astype(np.int32), [None])
    train = towerlib.build_train_graph(
        make_model(FLAGS.model), (batch, labels),
        tf.compat.v1.train.MomentumOptimizer(0.1, 0.9), num_towers=num_towers,
        accumulation_steps=accumulation_steps, precision=precision,
        summaries=False)
    session = tf.compat.v1.Session(config=towerlib.session_config(num_towers))
    session.run(tf.compat.v1.global_variables_initializer())
    return train, session, (batch, labels)


def _peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def measure_memory_in_this_process(accumulation_steps):
    """{baseline_mb, peak_mb} of one process training with `accumulation_steps`."""
    import numpy as np
    import tensorflow as tf

    with tf.Graph().as_default():
        train, session, (images, labels) = _graph(FLAGS.global_batch, accumulation_steps)
    tiny = accumulation_steps  # one example per micro-batch
    session.run(train.train_op, {images: np.zeros([tiny, 32, 32, 3], np.float32),
                                 labels: np.zeros([tiny], np.int32)})
    baseline = _peak_mb()
    for _ in range(FLAGS.steps):
        session.run(train.train_op)
    return {"baseline_mb": baseline, "peak_mb": _peak_mb()}


def _memory_in_fresh_process(accumulation_steps):
    output = subprocess.run(
        [sys.executable, os.path.abspath(__file__),
         f"--measure_memory={accumulation_steps}", f"--steps={FLAGS.steps}",
         f"--global_batch={FLAGS.global_batch}", f"--model={FLAGS.model}"],
        capture_output=True, text=True, check=True, timeout=1800, cwd=ROOT)
    return json.loads(output.stdout.strip().splitlines()[-1])


def _speed_ratio():
    import tensorflow as tf

    runs = {}
    for dtype in ("float32", "bfloat16"):
        with tf.Graph().as_default():
            train, session, _ = _graph(FLAGS.speed_batch, 1, num_towers=2,
                                       precision=dtype)
        for _ in range(3):
            session.run(train.train_op)
        runs[dtype] = (train, session)
    ratios = []
    for repetition in range(FLAGS.speed_repetitions):
        order = ["float32", "bfloat16"][::1 if repetition % 2 == 0 else -1]
        seconds = {}
        for dtype in order:
            train, session = runs[dtype]
            start = time.perf_counter()
            for _ in range(3):
                session.run(train.train_op)
            seconds[dtype] = (time.perf_counter() - start) / 3
        ratios.append((seconds["bfloat16"] / seconds["float32"], seconds))
    for train, session in runs.values():
        session.close()
    return ratios


def main(argv):
    del argv
    if FLAGS.measure_memory:
        print(json.dumps(measure_memory_in_this_process(int(FLAGS.measure_memory))))
        return
    k = FLAGS.accumulation_steps
    print(f"CIFAR {FLAGS.model}, {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.1f}")
    samples = {1: [], k: []}
    for repetition in range(FLAGS.repetitions):
        for steps in ([1, k] if repetition % 2 == 0 else [k, 1]):
            samples[steps].append(_memory_in_fresh_process(steps))
    step_mb = {s: statistics.median(m["peak_mb"] - m["baseline_mb"] for m in runs)
               for s, runs in samples.items()}
    peak_mb = {s: statistics.median(m["peak_mb"] for m in runs) for s, runs in samples.items()}
    print(f"| global batch {FLAGS.global_batch} | peak RSS (MB) | step memory above "
          "baseline (MB) |")
    print("| --- | --- | --- |")
    for steps in (1, k):
        label = "one batch" if steps == 1 else f"k = {steps} micro-batches"
        print(f"| {label} | {peak_mb[steps]:.0f} | {step_mb[steps]:.0f} |")
    target = (f" (target {targets.ACCUMULATION_MEMORY.text})"
              if k == targets.ACCUMULATION_STEPS else "")
    print(f"step memory, k = {k} / one batch: {step_mb[k] / step_mb[1]:.2f}x{target}; "
          f"peak RSS: {peak_mb[k] / peak_mb[1]:.2f}x")
    if FLAGS.speed_repetitions < 1:
        return
    ratios = _speed_ratio()
    values = [r for r, _ in ratios]
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    f32 = statistics.median(s["float32"] for _, s in ratios)
    bf16 = statistics.median(s["bfloat16"] for _, s in ratios)
    print(f"bfloat16 / float32 step time (batch {FLAGS.speed_batch}, 2 towers): "
          f"{median:.2f}x "
          f"(middle half {q1:.2f}-{q3:.2f}); medians {bf16:.3f} s vs {f32:.3f} s")
    print(f"load average at end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    app.run(main)

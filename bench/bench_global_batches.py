"""The global batch fixed by the step against the CIFAR-10 example's shuffled shards.

    python bench/bench_global_batches.py --train_records=5000 --repetitions=5

Two inputs of the CIFAR-10 example (examples/cifar10/input_pipeline.py), both with the
'tutorial' augmentation, on CIFAR-10 files generated in a temporary folder:

- 'shuffled': `train_dataset`, each worker its shard of the records, shuffled in a
  buffer of min(SHUFFLE_BUFFER = 20000, records) examples, its position saved by
  `towerlib.saved_position_iterator` (the shuffle buffer and prefetched batches);
- 'global': `global_train_batches` (towerlib.global_batch_input), the global batch
  fixed by the seed and the step, its position four int64 numbers.

Measured, each in interleaved repetitions (medians):

1. the data state in a checkpoint: the bytes a Saver of the input's state alone
   writes, and the time of one save, after --warm_batches batches (the shuffle
   buffer full);
2. the input's time per step for worker 0 of 2 workers x 2 towers (it reads half of
   the global batch), and worker 0's training step on its 2 towers (resnet8, the
   cross-worker all-reduce left out: it is the same for both inputs).

Not a test: numbers depend on the machine and on whatever else it runs.
"""

import os
import shutil
import statistics
import sys
import tempfile
import time

from absl import app, flags

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

FLAGS = flags.FLAGS
flags.DEFINE_integer("train_records", 5000, "Training records generated (CIFAR-10: 50000).")
flags.DEFINE_integer("global_batch", 128, "Examples per step, both workers.")
flags.DEFINE_integer("warm_batches", 20, "Batches read before a save (fills the buffer).")
flags.DEFINE_integer("repetitions", 5, "Interleaved repetitions of each measurement.")
flags.DEFINE_integer("steps", 20, "Steps timed per repetition of the step-time part.")
flags.DEFINE_bool("train_steps", True, "Also time worker 0's training step (resnet8).")

WORKERS, TOWERS = 2, 2


def _files(folder):
    from examples.cifar10 import data, generate

    per_file = max(1, FLAGS.train_records // 5)
    generate.generate(folder, train_per_file=per_file, test_examples=10)
    return data.validate_split(folder, "train")


def _input(kind, files, state):
    """(batch tensors of worker 0 of 2, the Saver of the input's state alone)."""
    import tensorflow as tf

    import towerlib
    from examples.cifar10 import input_pipeline

    share = FLAGS.global_batch // WORKERS
    if kind == "shuffled":
        dataset = input_pipeline.train_dataset(files, share, "tutorial", seed=1,
                                               num_shards=WORKERS, shard_index=0)
        batch = towerlib.saved_position_iterator(dataset).get_next()
        saved = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS)
    else:
        batch = input_pipeline.global_train_batches(
            files, FLAGS.global_batch, "tutorial", seed=1,
            workers=towerlib.WorkerGroup(WORKERS, 0))
        saved = tf.compat.v1.global_variables()
    return batch, tf.compat.v1.train.Saver(var_list=saved) if state else None


def _checkpoint(kind, files, folder):
    """(bytes, seconds) of one save of the input's state after warm_batches batches."""
    import tensorflow as tf

    with tf.Graph().as_default():
        batch, saver = _input(kind, files, state=True)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(tf.compat.v1.tables_initializer())  # the input, once they exist
            for _ in range(FLAGS.warm_batches):
                session.run(batch)
            prefix = os.path.join(folder, kind, "state")
            started = time.perf_counter()
            saver.save(session, prefix, write_meta_graph=False)
            seconds = time.perf_counter() - started
    written = [os.path.join(folder, kind, n) for n in os.listdir(os.path.join(folder, kind))
               if n.startswith("state.")]
    size = sum(os.path.getsize(p) for p in written)
    shutil.rmtree(os.path.join(folder, kind))
    return size, seconds


def _step_times(kind, files):
    """(seconds per input batch, seconds per training step of worker 0's 2 towers)."""
    import tensorflow as tf

    import towerlib
    from examples.cifar10.models import make_model

    with tf.Graph().as_default():
        batch, _ = _input(kind, files, state=False)
        train = None
        if FLAGS.train_steps:
            train = towerlib.build_train_graph(
                make_model("resnet8"), batch, tf.compat.v1.train.MomentumOptimizer(0.1, 0.9),
                num_towers=TOWERS, device_type="cpu", bn_mode="sync",
                update=towerlib.Replicated(), summaries=False)
        with tf.compat.v1.Session(config=towerlib.session_config(TOWERS)) as session:
            if train is not None:
                train.initialize(session)
            else:
                session.run(tf.compat.v1.global_variables_initializer())
                session.run(tf.compat.v1.tables_initializer())
            timed = {"input": lambda: session.run(batch)}
            if train is not None:
                timed["step"] = lambda: session.run(train.train_op)
            found = {}
            for name, run in timed.items():
                for _ in range(3):  # warm-up: the buffer, the kernels
                    run()
                started = time.perf_counter()
                for _ in range(FLAGS.steps):
                    run()
                found[name] = (time.perf_counter() - started) / FLAGS.steps
    return found.get("input"), found.get("step")


def main(argv):
    del argv
    folder = tempfile.mkdtemp(prefix="bench_global_batches_")
    try:
        files = _files(os.path.join(folder, "data"))
        kinds = ("shuffled", "global")
        rows = {kind: {"bytes": [], "save": [], "input": [], "step": []} for kind in kinds}
        for _ in range(FLAGS.repetitions):
            for kind in kinds:
                size, seconds = _checkpoint(kind, files, folder)
                rows[kind]["bytes"].append(size)
                rows[kind]["save"].append(seconds)
                read, step = _step_times(kind, files)
                rows[kind]["input"].append(read)
                if step is not None:
                    rows[kind]["step"].append(step)
        _report(rows, files.num_examples)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _report(rows, records):
    median = {kind: {k: statistics.median(v) if v else None for k, v in row.items()}
              for kind, row in rows.items()}
    old, new = median["shuffled"], median["global"]
    print(f"{records} training records, global batch {FLAGS.global_batch}, worker 0 of "
          f"{WORKERS} x {TOWERS} towers; medians of {FLAGS.repetitions} repetitions")
    print(f"{'input':10s} {'state bytes':>12s} {'save ms':>9s} {'input ms/step':>14s} "
          f"{'step ms':>9s}")
    for kind, row in median.items():
        step = f"{row['step'] * 1e3:9.1f}" if row["step"] is not None else f"{'-':>9s}"
        print(f"{kind:10s} {row['bytes']:12.0f} {row['save'] * 1e3:9.2f} "
              f"{row['input'] * 1e3:14.2f} {step}")
    print(f"ratio global/shuffled: state bytes {new['bytes'] / old['bytes']:.2e}, "
          f"save time {new['save'] / old['save']:.3f}, input time per step "
          f"{new['input'] / old['input']:.2f}" + (
              f", training step {new['step'] / old['step']:.2f}"
              if new["step"] is not None else ""))


if __name__ == "__main__":
    app.run(main)

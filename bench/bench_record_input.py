"""TFRecord shards read by index (towerlib.TFRecords) against the usual shuffled stream.

    python bench/bench_record_input.py --records=2000 --repetitions=3

On JPEG shards generated in a temporary folder in the layout tf_cnn_benchmarks reads
(`image/encoded`, `image/class/label`; examples/imagenet/records.py), measured in one process, interleaved:

1. input throughput (examples/s), JPEG decode off (parse only) and on:
   - 'indexed': towerlib.global_batch_input(towerlib.TFRecords(...)), each record read
     at its offset by tf.data ops;
   - 'stream': TFRecordDataset over the shards, interleave(cycle 4), shuffle(10_000),
     parse (and decode) in a parallel map, batch;
2. peak RSS of a process reading the indexed input over the shards and over 4 times
   as many (a child process each);
3. index build time per GB of shards (read from the page cache: the headers' cost).

Not a test: numbers depend on the machine and on whatever else it runs.
"""

import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app, flags

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

FLAGS = flags.FLAGS
flags.DEFINE_integer("records", 2000, "JPEG records generated (in 8 shards).")
flags.DEFINE_integer("image_size", 160, "Side of the generated JPEGs.")
flags.DEFINE_integer("batch", 64, "Examples per batch.")
flags.DEFINE_integer("batches", 15, "Batches timed per repetition.")
flags.DEFINE_integer("repetitions", 3, "Interleaved repetitions.")
flags.DEFINE_string("rss_child", None, "Internal: read this folder's shards, print RSS.")

SHARDS = 8


def _parse(decode_jpeg):
    import tensorflow as tf

    from examples.imagenet import records

    def parse(record):
        parsed = records.parse(record)
        image = parsed["jpeg"]
        value = (tf.reduce_mean(tf.cast(tf.io.decode_jpeg(image, channels=3), tf.float32))
                 if decode_jpeg else tf.cast(tf.strings.length(image), tf.float32))
        return value, parsed["label"]
    return parse


def _batches(kind, folder, decode_jpeg):
    import tensorflow as tf

    import towerlib

    pattern = os.path.join(folder, "train-*[0-9]")
    if kind == "indexed":
        return towerlib.global_batch_input(
            towerlib.TFRecords(pattern, decode=_parse(decode_jpeg)), FLAGS.batch, seed=1)
    files = tf.data.Dataset.list_files(pattern, shuffle=True, seed=1).repeat()
    dataset = files.interleave(tf.data.TFRecordDataset, cycle_length=4,
                               num_parallel_calls=tf.data.AUTOTUNE)
    dataset = dataset.shuffle(10_000, seed=1).map(_parse(decode_jpeg),
                                                  num_parallel_calls=tf.data.AUTOTUNE)
    dataset = dataset.batch(FLAGS.batch, drop_remainder=True).prefetch(2)
    return tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()


def _throughput(kind, folder, decode_jpeg):
    """Examples per second over FLAGS.batches batches, after 3 to warm up."""
    import tensorflow as tf

    with tf.Graph().as_default():
        batch = _batches(kind, folder, decode_jpeg)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(tf.compat.v1.tables_initializer())
            for _ in range(3):
                session.run(batch)
            started = time.perf_counter()
            for _ in range(FLAGS.batches):
                session.run(batch)
            return FLAGS.batches * FLAGS.batch / (time.perf_counter() - started)


def _rss_child(folder):
    import tensorflow as tf

    with tf.Graph().as_default():
        batch = _batches("indexed", folder, True)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(tf.compat.v1.tables_initializer())
            for _ in range(FLAGS.batches):
                session.run(batch)
    print("peak_rss_kb", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def _peak_rss_mb(folder):
    done = subprocess.run([sys.executable, __file__, f"--rss_child={folder}",
                           f"--batch={FLAGS.batch}", f"--batches={FLAGS.batches}"],
                          capture_output=True, text=True, timeout=900, check=True)
    return int(done.stdout.split("peak_rss_kb")[1].split()[0]) / 1024


def _folder_gb(folder):
    return sum(os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder)
               if "towerlib-index" not in n) / 1e9


def _index_seconds(folder):
    import towerlib

    for name in os.listdir(folder):
        if name.endswith(".towerlib-index"):
            os.remove(os.path.join(folder, name))
    started = time.perf_counter()
    towerlib.TFRecords(os.path.join(folder, "train-*[0-9]")).num_examples
    return time.perf_counter() - started


def main(argv):
    del argv
    from examples.imagenet import records

    if FLAGS.rss_child:
        _rss_child(FLAGS.rss_child)
        return
    work = tempfile.mkdtemp(prefix="bench_record_input_")
    try:
        one, four = os.path.join(work, "1x"), os.path.join(work, "4x")
        records.write_shards(one, FLAGS.records, SHARDS, FLAGS.image_size, seed=0)
        records.write_shards(four, 4 * FLAGS.records, 4 * SHARDS, FLAGS.image_size, seed=1)
        print(f"load before: {os.getloadavg()}")
        seconds = _index_seconds(four)
        print(f"index build: {seconds:.2f} s for {_folder_gb(four):.3f} GB "
              f"({seconds / _folder_gb(four):.2f} s/GB, headers from the page cache)")
        for decode_jpeg in (False, True):
            found = {"indexed": [], "stream": []}
            for _ in range(FLAGS.repetitions):
                for kind in found:
                    found[kind].append(_throughput(kind, one, decode_jpeg))
            medians = {kind: statistics.median(v) for kind, v in found.items()}
            print(f"decode_jpeg={decode_jpeg}: examples/s indexed {medians['indexed']:.0f}, "
                  f"stream {medians['stream']:.0f}; ratio indexed/stream "
                  f"{medians['indexed'] / medians['stream']:.2f}")
        small, large = _peak_rss_mb(one), _peak_rss_mb(four)
        print(f"peak RSS: {small:.0f} MB over {_folder_gb(one):.3f} GB, {large:.0f} MB over "
              f"{_folder_gb(four):.3f} GB; ratio 4x/1x {large / small:.2f}")
        print(f"load after: {os.getloadavg()}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    app.run(main)

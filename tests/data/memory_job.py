"""Reads a few global batches from a record source and prints the process's peak RSS.

    python tests/data/memory_job.py --kind=tfrecords --data_dir=D --steps=30

tests/data/test_record_memory.py runs it on a data set and on one 4 times its
size: a source read by index holds the prefetched batches and the reads in
flight, not the files.
"""

import argparse
import resource

import tensorflow as tf

import towerlib

RECORD_BYTES = 64 * 1024


def source_of(kind, data_dir):
    if kind == "tfrecords":
        from tests.data.record_files import decode
        return towerlib.TFRecords(f"{data_dir}/train-*.tfrecord", decode=decode)
    return towerlib.FixedLengthRecords(
        f"{data_dir}/part-*.bin", RECORD_BYTES,
        lambda record: tf.io.decode_raw(tf.strings.substr(record, 0, 4), tf.int32)[0])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--kind", choices=["tfrecords", "fixed"], required=True)
    parser.add_argument("--data_dir", required=True)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()
    with tf.Graph().as_default():
        batch = towerlib.global_batch_input(source_of(args.kind, args.data_dir), args.batch,
                                            seed=1)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(tf.compat.v1.tables_initializer())
            for _ in range(args.steps):
                session.run(batch)
    print("peak_rss_kb", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, flush=True)


if __name__ == "__main__":
    main()

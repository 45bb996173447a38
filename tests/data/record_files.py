"""TFRecord shards of tf.train.Examples for the record-source tests and jobs."""

import numpy as np
import tensorflow as tf

FEATURES = {"x": tf.io.FixedLenFeature([6], tf.float32),
            "label": tf.io.FixedLenFeature([], tf.int64)}


def write_shards(folder, features, labels, num_shards, padding=0):
    """Writes the rows as num_shards files folder/train-<k>.tfrecord, in order.

    `padding` extra bytes per record (a 'blob' feature) make the shards big.
    """
    folder.mkdir(parents=True, exist_ok=True)
    bounds = np.linspace(0, len(labels), num_shards + 1).astype(int)
    paths = []
    blob = b"\0" * padding
    for k in range(num_shards):
        path = str(folder / f"train-{k:05d}.tfrecord")
        with tf.io.TFRecordWriter(path) as writer:
            for i in range(bounds[k], bounds[k + 1]):
                feature = {
                    "x": tf.train.Feature(float_list=tf.train.FloatList(value=features[i])),
                    "label": tf.train.Feature(int64_list=tf.train.Int64List(
                        value=[int(labels[i])])),
                    "blob": tf.train.Feature(bytes_list=tf.train.BytesList(value=[blob]))}
                writer.write(tf.train.Example(features=tf.train.Features(
                    feature=feature)).SerializeToString())
        paths.append(path)
    return paths


def decode(record):
    """(x float32 [6], label int32 []) of one serialized Example."""
    parsed = tf.io.parse_single_example(record, FEATURES)
    return parsed["x"], tf.cast(parsed["label"], tf.int32)

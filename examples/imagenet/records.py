"""ImageNet records as tf_cnn_benchmarks and the TensorFlow models read them.

A record is a serialized tf.train.Example; this example reads two of its features:

    image/encoded      bytes   the JPEG
    image/class/label  int64   1..1000 (0 is left to a background class, so the
                               network has NUM_CLASSES = 1001 outputs, as theirs do)

Real shards (`train-00000-of-01024` ...) carry more features (boxes, synsets, sizes);
they are in the files and not read. `write_shards` makes small shards in the same
layout for the tests and the quickstart.

Decoding is split in two, as towerlib.global_batch_input wants it:

- `parse` (the source's decode): record -> {"jpeg": string, "label": int32}, no pixels;
- `train_augment(size)` (the input's augment): a random crop of 8%-100% of the area
  and 3/4-4/3 of aspect, decoded from the JPEG's crop window only, resized to
  size x size, a random left-right flip, and standardized with ImageNet's channel
  means and deviations. Every random choice is a stateless op of the example's seed,
  so an example's crop is the same on any number of workers and after a resume.
"""

import os

import numpy as np
import tensorflow as tf

__all__ = ["FEATURES", "NUM_CLASSES", "parse", "train_augment", "write_shards"]

NUM_CLASSES = 1001
FEATURES = {
    "image/encoded": tf.io.FixedLenFeature([], tf.string),
    "image/class/label": tf.io.FixedLenFeature([], tf.int64),
}
# ImageNet's per-channel mean and standard deviation of pixel values in [0, 1].
_MEAN = (0.485, 0.456, 0.406)
_STD = (0.229, 0.224, 0.225)


def write_shards(folder, num_records, num_shards=8, image_size=64, seed=0):
    """Writes `num_records` JPEG records into `num_shards` files train-KKKKK-of-NNNNN.

    Each image is a colour gradient tinted by its label, plus noise (so the JPEGs
    are neither trivial nor all alike); labels are uniform in 1..1000.

    Returns:
      The shard paths, in order. Records are split as evenly as the count allows.
    """
    os.makedirs(folder, exist_ok=True)
    rng = np.random.RandomState(seed)
    ramp = np.linspace(0.0, 1.0, image_size)[None, :, None] * np.ones([image_size, 1, 3])
    paths = []
    for shard, count in enumerate(_split(num_records, num_shards)):
        path = os.path.join(folder, f"train-{shard:05d}-of-{num_shards:05d}")
        with tf.io.TFRecordWriter(path) as writer:
            for _ in range(count):
                label = int(rng.randint(1, NUM_CLASSES))
                tint = np.array([label % 10, label // 10 % 10, label // 100], float) / 10
                noise = rng.uniform(0, 0.25, size=[image_size, image_size, 3])
                pixels = np.clip(255 * (0.5 * ramp + 0.4 * tint + noise), 0, 255)
                writer.write(_example(pixels.astype(np.uint8), label))
        paths.append(path)
    return paths


def _split(total, parts):
    base, extra = divmod(total, parts)
    return [base + (1 if k < extra else 0) for k in range(parts)]


def _example(pixels, label):
    """One serialized tf.train.Example of the layout above."""
    jpeg = tf.io.encode_jpeg(pixels, quality=90).numpy()
    feature = {
        "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[jpeg])),
        "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def parse(record):
    """record (tf.string scalar) -> {"jpeg": tf.string scalar, "label": int32 scalar}."""
    parsed = tf.io.parse_single_example(record, FEATURES)
    return {"jpeg": parsed["image/encoded"],
            "label": tf.cast(parsed["image/class/label"], tf.int32)}


def train_augment(image_size):
    """An augment for global_batch_input: (parsed example, seed int64 [2]) ->
    (image float32 [image_size, image_size, 3] standardized, label int32 scalar)."""
    def augment(example, seed):
        crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
        jpeg = example["jpeg"]
        begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
            tf.image.extract_jpeg_shape(jpeg), tf.zeros([1, 0, 4]), seed=crop_seed,
            min_object_covered=0.08, aspect_ratio_range=(3 / 4, 4 / 3),
            area_range=(0.08, 1.0), max_attempts=10,
            use_image_if_no_bounding_boxes=True)
        window = tf.stack([begin[0], begin[1], size[0], size[1]])
        image = tf.image.decode_and_crop_jpeg(jpeg, window, channels=3)
        image = tf.image.resize(tf.cast(image, tf.float32) / 255.0, [image_size, image_size])
        image = tf.image.stateless_random_flip_left_right(image, flip_seed)
        image = (image - tf.constant(_MEAN)) / tf.constant(_STD)
        return tf.ensure_shape(image, [image_size, image_size, 3]), example["label"]
    return augment

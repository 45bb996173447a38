"""The global batch: in memory (synthetic) or from the CIFAR-10 binary files.

Synthetic input is one fixed batch of standardized images and labels, kept in
memory and served by `tf.data.Dataset.from_tensors(batch).repeat()`: the same
path for every configuration, cheap enough that the step measures training,
not input. The real input is the CIFAR-10 example's pipeline (binary records,
augmentation, shuffling, prefetching); comparing the two at the same step
shows whether the input keeps up.
"""

import numpy as np
import tensorflow as tf

IMAGE_SHAPE = (32, 32, 3)
NUM_CLASSES = 10


def synthetic_batch(batch_size, seed):
    """(images float32 [B, 32, 32, 3] ~ N(0, 1), labels int32 [B]) from `seed`."""
    rng = np.random.RandomState(seed)
    images = rng.standard_normal((batch_size,) + IMAGE_SHAPE).astype(np.float32)
    labels = rng.randint(0, NUM_CLASSES, batch_size).astype(np.int32)
    return images, labels


def synthetic_dataset(batch_size, seed):
    """The fixed global batch, repeated forever."""
    return tf.data.Dataset.from_tensors(synthetic_batch(batch_size, seed)).repeat()


def cifar_dataset(data_dir, batch_size, augmentation, seed):
    """The CIFAR-10 example's training stream in global batches of `batch_size`."""
    from examples.cifar10 import data, input_pipeline  # the example owns the format
    split_files = data.validate_split(data_dir, "train")
    return input_pipeline.train_dataset(split_files, batch_size, augmentation=augmentation,
                                        seed=seed)


def graph_input(dataset, host_device="/device:CPU:0"):
    """The next global batch as graph tensors, from a one-shot iterator on the host."""
    with tf.device(host_device), tf.name_scope("input"):
        return tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()

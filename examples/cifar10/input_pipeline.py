"""tf.data input pipelines for CIFAR-10: augmentation, shuffling, batching, prefetching.

Both pipelines yield ``(images float32 [B, 32, 32, 3], labels int32 [B])``, where ``B`` is
the GLOBAL batch: towerlib splits it across the towers, so the input side does not know or
care how many towers there are, and one element is one optimizer step.

Both training augmentations keep the 32x32 size (the original tutorial cropped to 24x24),
so the evaluation input is the untouched image and both models see the same input shape:

- ``tutorial``: pad 4 + random 32x32 crop, random left-right flip, random brightness
  (+-63 of 255), random contrast (x0.2..x1.8), per-image standardization.
- ``resnet``: pad 4 + random 32x32 crop, random left-right flip, per-image standardization.

Evaluation applies only the per-image standardization and is deterministic.
"""

from typing import Optional

import tensorflow as tf

from examples.cifar10 import data

AUGMENTATIONS = ("tutorial", "resnet")

PAD_PIXELS = 4
# The tutorial's values, on the 0..255 scale it applied them to.
BRIGHTNESS_MAX_DELTA = 63.0
CONTRAST_RANGE = (0.2, 1.8)
# A full-epoch shuffle for the generated set (5000 examples) and a large window for the
# real one (50000); the records are cached in memory, so the buffer costs only RAM.
SHUFFLE_BUFFER = 20000


def _random_pad_crop_flip(image):
    """uint8/float [32, 32, 3] -> float32 [32, 32, 3]: a random 32x32 window of the image
    zero-padded by PAD_PIXELS on each side, flipped left-right with probability 1/2."""
    image = tf.cast(image, tf.float32)
    padded = tf.pad(image, [[PAD_PIXELS, PAD_PIXELS], [PAD_PIXELS, PAD_PIXELS], [0, 0]])
    cropped = tf.image.random_crop(
        padded, [data.IMAGE_SIZE, data.IMAGE_SIZE, data.IMAGE_CHANNELS]
    )
    return tf.image.random_flip_left_right(cropped)


def augment_tutorial(image):
    """The tutorial's distortions at 32x32: uint8 [32, 32, 3] -> standardized float32."""
    image = _random_pad_crop_flip(image)
    image = tf.image.random_brightness(image, max_delta=BRIGHTNESS_MAX_DELTA)
    image = tf.image.random_contrast(image, *CONTRAST_RANGE)
    return tf.image.per_image_standardization(image)


def augment_resnet(image):
    """The CIFAR ResNet paper's augmentation: uint8 [32, 32, 3] -> standardized float32."""
    return tf.image.per_image_standardization(_random_pad_crop_flip(image))


def preprocess_eval(image):
    """uint8 or float [32, 32, 3] (or a batch [N, 32, 32, 3]) -> float32 of the same shape
    with zero mean and unit variance per image."""
    return tf.image.per_image_standardization(tf.cast(image, tf.float32))


_AUGMENT_FNS = {"tutorial": augment_tutorial, "resnet": augment_resnet}


def check_augmentation(name: str) -> None:
    if name not in _AUGMENT_FNS:
        raise ValueError(
            "Unknown augmentation %r; expected one of %s."
            % (name, ", ".join(AUGMENTATIONS))
        )


def train_dataset(
    split_files: data.SplitFiles,
    global_batch_size: int,
    augmentation: str = "tutorial",
    seed: Optional[int] = None,
    shuffle_buffer: int = SHUFFLE_BUFFER,
):
    """The endless, shuffled, augmented training stream in global batches.

    Args:
      split_files: the validated training files (data.validate_split(dir, 'train')).
      global_batch_size: examples per element = per optimizer step, over all towers.
      augmentation: 'tutorial' or 'resnet'.
      seed: seeds the shuffle order (augmentation randomness stays op-seeded by the graph).
      shuffle_buffer: examples in the shuffle window.

    Returns:
      A dataset of (images float32 [global_batch_size, 32, 32, 3], labels int32
      [global_batch_size]); the batch dimension is static (a partial batch at the end of an
      epoch cannot happen because the stream repeats, and drop_remainder makes that static).
    """
    check_augmentation(augmentation)
    if global_batch_size < 1:
        raise ValueError("global_batch_size must be >= 1, got %d" % global_batch_size)
    augment = _AUGMENT_FNS[augmentation]
    dataset = data.records_dataset(split_files.paths).cache()
    dataset = dataset.shuffle(
        min(shuffle_buffer, split_files.num_examples),
        seed=seed,
        reshuffle_each_iteration=True,
    ).repeat()
    dataset = dataset.map(
        lambda image, label: (augment(image), label),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=False,
    )
    dataset = dataset.batch(global_batch_size, drop_remainder=True)
    return dataset.prefetch(tf.data.AUTOTUNE)


def eval_dataset(split_files: data.SplitFiles, batch_size: int):
    """One deterministic pass over ``split_files`` in file order, in batches.

    Returns:
      A dataset of (images float32 [<=batch_size, 32, 32, 3], labels int32 [<=batch_size]);
      the last batch is partial when the split is not a multiple of batch_size, so every
      example is evaluated exactly once.
    """
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1, got %d" % batch_size)
    dataset = data.records_dataset(split_files.paths)
    dataset = dataset.map(
        lambda image, label: (preprocess_eval(image), label),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )
    return dataset.batch(batch_size).prefetch(tf.data.AUTOTUNE)

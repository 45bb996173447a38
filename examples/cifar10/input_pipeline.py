"""tf.data input pipelines for CIFAR-10: augmentation, shuffling, batching, prefetching.

The pipelines yield ``(images float32 [B, 32, 32, 3], labels int32 [B])``, where ``B`` is
the GLOBAL batch: towerlib splits it across the towers, so the input side does not know or
care how many towers there are, and one element is one optimizer step. The default
training input, ``global_train_batches``, fixes the global batch of every step by the seed
and the step (towerlib.global_batch_input): in a cluster each worker reads its slice of
it, and a run may change its number of workers or towers between two lives. The older
``train_dataset`` (the parameter-server path) has each worker read its own shard of the
records and ``B`` its share of the global batch (global batch / workers).

Both training augmentations keep the 32x32 size (the original tutorial cropped to 24x24),
so the evaluation input is the untouched image and both models see the same input shape:

- ``tutorial``: pad 4 + random 32x32 crop, random left-right flip, random brightness
  (+-63 of 255), random contrast (x0.2..x1.8), per-image standardization.
- ``resnet``: pad 4 + random 32x32 crop, random left-right flip, per-image standardization.

Evaluation applies only the per-image standardization and is deterministic.
"""

from typing import Optional

import tensorflow as tf

import towerlib
from examples.cifar10 import data

AUGMENTATIONS = ("tutorial", "resnet")

PAD_PIXELS = 4
# The tutorial's values, on the 0..255 scale it applied them to.
BRIGHTNESS_MAX_DELTA = 63.0
CONTRAST_RANGE = (0.2, 1.8)
# A full-epoch shuffle for the generated set (5000 examples) and a large window for the
# real one (50000); the records are cached in memory, so the buffer costs only RAM.
SHUFFLE_BUFFER = 20000
# The data order of a run without --seed (global_train_batches): the same on every worker
# and at every restart, as the run's definition needs; the weights still start at random.
DEFAULT_DATA_SEED = 0


def _random_pad_crop_flip(image, seed=None):
    """uint8/float [32, 32, 3] -> float32 [32, 32, 3]: a random 32x32 window of the image
    zero-padded by PAD_PIXELS on each side, flipped left-right with probability 1/2.
    ``seed``: int64 [2], this element's own (stateless ops: see train_dataset); None
    draws one (outside a saved pipeline only: that draw is a stateful op)."""
    if seed is None:
        seed = tf.random.uniform([2], maxval=2**62, dtype=tf.int64)
    crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    image = tf.cast(image, tf.float32)
    padded = tf.pad(image, [[PAD_PIXELS, PAD_PIXELS], [PAD_PIXELS, PAD_PIXELS], [0, 0]])
    cropped = tf.image.stateless_random_crop(
        padded, [data.IMAGE_SIZE, data.IMAGE_SIZE, data.IMAGE_CHANNELS], seed=crop_seed
    )
    return tf.image.stateless_random_flip_left_right(cropped, seed=flip_seed)


def augment_tutorial(image, seed):
    """The tutorial's distortions at 32x32: uint8 [32, 32, 3] -> standardized float32."""
    geometry_seed, brightness_seed, contrast_seed = tf.unstack(
        tf.random.experimental.stateless_split(seed, 3)
    )
    image = _random_pad_crop_flip(image, geometry_seed)
    image = tf.image.stateless_random_brightness(
        image, max_delta=BRIGHTNESS_MAX_DELTA, seed=brightness_seed
    )
    image = tf.image.stateless_random_contrast(image, *CONTRAST_RANGE, seed=contrast_seed)
    return tf.image.per_image_standardization(image)


def augment_resnet(image, seed):
    """The CIFAR ResNet paper's augmentation: uint8 [32, 32, 3] -> standardized float32."""
    return tf.image.per_image_standardization(_random_pad_crop_flip(image, seed))


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


def train_records(split_files: data.SplitFiles, num_shards: int = 1, shard_index: int = 0):
    """The training records (image uint8, label int32) this process reads, in file order.

    With ``num_shards`` > 1 (one shard per worker of a cluster), every ``num_shards``-th
    record starting at ``shard_index``: the shards are disjoint, cover the split, and differ
    in size by at most one record. Sharding comes before the cache and the shuffle, so each
    worker keeps and shuffles only its own records.
    """
    if not 0 <= shard_index < num_shards:
        raise ValueError(
            "shard_index must be in 0..%d for %d shards, got %d"
            % (num_shards - 1, num_shards, shard_index)
        )
    dataset = data.records_dataset(split_files.paths)
    if num_shards > 1:
        dataset = dataset.shard(num_shards, shard_index)
    return dataset


def shard_size(num_examples: int, num_shards: int, shard_index: int) -> int:
    """Records in shard ``shard_index`` of ``num_shards`` (as ``train_records`` splits)."""
    return len(range(shard_index, num_examples, num_shards))


def train_dataset(
    split_files: data.SplitFiles,
    batch_size: int,
    augmentation: str = "tutorial",
    seed: Optional[int] = None,
    shuffle_buffer: int = SHUFFLE_BUFFER,
    num_shards: int = 1,
    shard_index: int = 0,
):
    """The endless, shuffled, augmented training stream, one optimizer step per element.

    Args:
      split_files: the validated training files (data.validate_split(dir, 'train')).
      batch_size: examples per element: the global batch on one machine (towerlib splits
        it over the towers), this worker's share of it in a cluster.
      augmentation: 'tutorial' or 'resnet'.
      seed: seeds the shuffle order and the augmentation (None: random ones). The
        augmentation uses stateless random ops, each element with its own seed pair drawn
        from tf.data.Dataset.random(seed), and the map keeps the order: the stream is a
        function of the seed, and its whole state (file offsets, shuffle buffer, random
        streams) can be saved in a checkpoint (towerlib.saved_position_iterator).
      shuffle_buffer: examples in the shuffle window.
      num_shards, shard_index: read only this shard of the records (see train_records):
        in a cluster, the number of workers and this worker's index.

    Returns:
      A dataset of (images float32 [batch_size, 32, 32, 3], labels int32 [batch_size]);
      the batch dimension is static (a partial batch at the end of an epoch cannot happen
      because the stream repeats, and drop_remainder makes that static).
    """
    check_augmentation(augmentation)
    if batch_size < 1:
        raise ValueError(
            "batch_size (the global_batch_size, or a worker's share of it) must be "
            ">= 1, got %d" % batch_size
        )
    augment = _AUGMENT_FNS[augmentation]
    records = shard_size(split_files.num_examples, num_shards, shard_index)
    if records < 1:
        raise ValueError(
            "Shard %d of %d of %d training examples is empty."
            % (shard_index, num_shards, split_files.num_examples)
        )
    # No cache(): a saved position would hold the whole cache (the files are re-read,
    # from the page cache, each epoch).
    dataset = train_records(split_files, num_shards, shard_index)
    dataset = dataset.shuffle(
        min(shuffle_buffer, records),
        seed=seed,
        reshuffle_each_iteration=True,
    ).repeat()
    # One stateless seed pair per element, from a random stream that is part of the
    # pipeline's saved state.
    element_seeds = tf.data.Dataset.random(seed=seed).batch(2)
    dataset = tf.data.Dataset.zip((dataset, element_seeds)).map(
        lambda record, element_seed: (augment(record[0], element_seed), record[1]),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )
    dataset = dataset.batch(batch_size, drop_remainder=True)
    return dataset.prefetch(tf.data.AUTOTUNE)


def global_train_batches(
    split_files: data.SplitFiles,
    global_batch_size: int,
    augmentation: str = "tutorial",
    seed: Optional[int] = None,
    workers=None,
):
    """This process's slice of each step's global batch, fixed by the seed and the step.

    towerlib.global_batch_input over the training files (held in memory, 150 MB for the
    real set: in_memory=True, since a streamed read passes the bytes before its record in
    its 30 MB file): every epoch a fresh permutation of the records computed from the
    seed, each image augmented with a seed of its own made of (seed, epoch * n + record),
    and worker r of a cluster reads only its contiguous slice of each global batch. So
    the global batch of every step is the same on any number of workers and towers, and a
    run may resume on another topology; its position in checkpoints is six numbers (the
    data's count and fingerprint among them), no shuffle buffer.

    Args:
      split_files: the validated training files (data.validate_split(dir, 'train')).
      global_batch_size: the examples of one step, whole cluster.
      augmentation: 'tutorial' or 'resnet'.
      seed: the data order and augmentation; None gives DEFAULT_DATA_SEED (every worker,
        and every restart, must read the same order).
      workers: a towerlib.WorkerGroup (a cluster's all-reduce workers) or None.

    Returns:
      (images float32 [n, 32, 32, 3], labels int32 [n]) tensors, n this process's share
      of the global batch; read once per step.
    """
    check_augmentation(augmentation)
    augment = _AUGMENT_FNS[augmentation]
    source = towerlib.FixedLengthRecords(list(split_files.paths), data.RECORD_BYTES,
                                         data.decode_record, in_memory=True)
    return towerlib.global_batch_input(
        source, global_batch_size, seed=DEFAULT_DATA_SEED if seed is None else seed,
        workers=workers, augment=lambda example, key: (augment(example[0], key), example[1]))


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

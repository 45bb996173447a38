"""The order global_batch_input reads: example and augmentation seed of each position.

The run reads one endless stream of positions p = 0, 1, 2, ...; step s's
global batch is positions [s * B, (s + 1) * B) (while the global batch has
not changed), and worker r of W reads the contiguous slice
[start_r, start_r + size_r) of it, sizes as towerlib splits a batch (the
first B % W workers one example more). Position p is, with e = p // n:

    example(p) = RandomIndexShuffle(index=p % n, seed=[seed, e, 0x67626174],
                                    max_index=n - 1)
    augment_seed(p) = [seed, e * n + example(p)]

a fresh permutation of the n examples every epoch (the third seed word keeps
it apart from other users of the seed), computed from p alone.
`tf.random.experimental.index_shuffle(p % n, [seed, e, 0x67626174], n - 1)`
is the same op for one epoch's positions (docs/distributed.md).
"""

import numbers

import numpy as np
import tensorflow as tf

from towerlib.internals import index_shuffle

__all__ = ["SHUFFLE_SALT", "global_batch_examples", "positions_examples", "slice_bounds"]

# Keeps the example permutations apart from other users of the same seed.
SHUFFLE_SALT = 0x67626174


def slice_bounds(global_batch_size, num_workers, worker_index):
    """[start, end) of worker `worker_index`'s slice of each global batch."""
    base, extra = divmod(global_batch_size, num_workers)
    sizes = [base + (1 if w < extra else 0) for w in range(num_workers)]
    start = sum(sizes[:worker_index])
    return start, start + sizes[worker_index]


def positions_examples(positions, seed, num_examples):
    """(examples int64 [k], augmentation seeds int64 [k, 2]) of int64 positions [k]."""
    positions = tf.convert_to_tensor(positions, tf.int64)
    size = tf.shape(positions)[0]
    epochs = positions // num_examples
    seeds = tf.stack([tf.fill([size], tf.constant(seed, tf.int64)), epochs,
                      tf.fill([size], tf.constant(SHUFFLE_SALT, tf.int64))], axis=1)
    examples = index_shuffle.shuffled_indices(positions % num_examples, seeds,
                                              num_examples - 1)
    keys = tf.stack([tf.fill([size], tf.constant(seed, tf.int64)),
                     epochs * num_examples + examples], axis=1)
    return examples, keys


def _count(value, name, low):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise ValueError(f"global_batch_examples: {name}={value!r}; give an int >= {low}.")
    return int(value)


def global_batch_examples(step, *, seed, num_examples, global_batch_size, num_workers=1,
                          worker_index=None):
    """The example indices global_batch_input reads at `step` (int64 numpy [k]).

    Args:
      step: the step (0 is the first), counted since the global batch last
        changed (an allow_new_global_batch resume starts the count again at
        the position it reached).
      seed, num_examples, global_batch_size: as given to global_batch_input.
      num_workers, worker_index: None for the whole global batch (in worker
        order), or worker r's slice of it.
    """
    step = _count(step, "step", 0)
    n = _count(num_examples, "num_examples", 1)
    batch = _count(global_batch_size, "global_batch_size", 1)
    start, end = (0, batch) if worker_index is None else slice_bounds(
        batch, _count(num_workers, "num_workers", 1), worker_index)
    first = step * batch
    with tf.Graph().as_default():
        examples, _ = positions_examples(np.arange(first + start, first + end), seed, n)
        with tf.compat.v1.Session() as session:
            return session.run(examples)

"""A batch of positions in seeded permutations, each position with its own seed.

`tf.random.experimental.index_shuffle` (TF 2.21) takes a batch of indices
only with one seed for all of them: its batched seeds fail inside the op
("Seed must be a vector of size [3] or a matrix of size [n, 3] but got
[n+1, 2]"). The op beneath it, `tf.raw_ops.RandomIndexShuffle`, takes seeds
of shape [n, 3], one row per index, and is what this module calls.

The permutation an index maps to is part of a run's definition (a resumed
run must read the same examples): tests/internals/test_internals.py pins a
few of its outputs and fails by name if a release changes them.
"""

import tensorflow as tf

__all__ = ["shuffled_indices"]


def shuffled_indices(index, seeds, max_index):
    """int64 [n]: index[j]'s place in the permutation of [0, max_index[j]] of seeds[j].

    Args:
      index: int64 [n], each in [0, max_index[j]].
      seeds: int64 [n, 3], one permutation per distinct row.
      max_index: int64 [n] (or a scalar, broadcast).
    """
    index = tf.convert_to_tensor(index, tf.int64)
    max_index = tf.broadcast_to(tf.convert_to_tensor(max_index, tf.int64), tf.shape(index))
    return tf.raw_ops.RandomIndexShuffle(index=index, seed=tf.cast(seeds, tf.int64),
                                         max_index=max_index)

"""Seeding a graph-mode run so that it repeats exactly.

With `seed_everything(seed)` called inside `with graph.as_default():` before
any op is created, every random op (initializers, dropout, shuffles) gets an
op seed derived from the graph seed and the op's creation order, so the
same program builds the same random streams. On CPU, with the same devices
and tower count, two runs then give the same losses step for step (tested:
tests/run/test_faults_determinism.py and the kill/resume test, which compares
final weights bit for bit). What it does not cover, notably on GPUs, is in
docs/faults.md ("Two runs differ").
"""

import random

import numpy as np
import tensorflow as tf


def seed_everything(seed, op_determinism=False):
    """Seeds the default graph, Python's `random` and NumPy.

    Args:
      seed: int.
      op_determinism: also call tf.config.experimental.enable_op_determinism(),
        which makes GPU kernels deterministic (or raise for ops that have no
        deterministic implementation). It is process-wide, costs speed on
        GPUs, and no public API turns it off again.
    """
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {seed!r}.")
    tf.compat.v1.set_random_seed(seed)
    random.seed(seed)
    np.random.seed(seed % (2 ** 32))
    if op_determinism:
        tf.config.experimental.enable_op_determinism()

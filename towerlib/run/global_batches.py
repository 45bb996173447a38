"""An input whose global batch at each step is a function of the seed and the position.

    images, labels = towerlib.global_batch_input((train_images, train_labels), 128,
                                                 seed=1, workers=group, augment=flip)
    train = towerlib.build_train_graph(model, (images, labels), optimizer, ...)

The run reads one endless stream of example positions. Position p is example
`index_shuffle(p % n, seed=(seed, p // n))` of epoch p // n: every epoch is a
fresh permutation of the n examples, computed from the index alone (no
shuffle buffer). The global batch of a step is the next B positions; worker r
of W reads only its contiguous slice of them (the first B % W workers one
example more, as towerlib splits a batch over towers), and its towers split
that slice as usual. The augmentation of an example gets a stateless seed
made of (seed, epoch, example). So the examples of every step and their
randomness depend on the seed and the position alone: not on the number of
workers, towers or accumulation micro-batches, and a run resumed on another
topology trains on the same global batches as one that never stopped.

The saved state is four int64 variables under `name/` in every checkpoint:
the seed, the global batch size, the examples read before the global batch
last changed (0 unless allow_new_global_batch resumed another size) and the
batches read since. A batch counts when the step reads it (a float16 step
skipped for overflow still read its batch, as in an uninterrupted run). The
position of the next batch is `examples_before + batches_read *
global_batch_size`; a resumed run saves the numbers an uninterrupted one does.

The iterator is initializable: its initializer reads that position, so it
must run after every restore. It is in the TABLE_INITIALIZERS collection,
which the default Scaffold's local_init_op runs after restoring (so
run_training and MonitoredTrainingSession need nothing), as does
TrainGraph.initialize; after a Saver.restore of your own, run
`tf.compat.v1.tables_initializer()` again.

Compared with `towerlib.saved_position_iterator`, which saves a pipeline's
whole tf.data state (its shuffle buffer and prefetched batches, tied to the
worker's shard and worker count), this needs its examples addressable by
index: in-memory arrays, or fixed-length record files (loaded in memory
once per process).
"""

import dataclasses
import logging
import numbers
from typing import Any, Callable

import numpy as np
import tensorflow as tf

from towerlib.checks import data_checks
from towerlib.exchange.group import ONE_WORKER, WorkerGroup
from towerlib.internals import index_shuffle
from towerlib.run import data_position
from towerlib.run.checkpoint_state import CheckpointError
from towerlib.step import inputs as inputs_lib

__all__ = ["FixedLengthRecords", "GlobalBatchInput", "check_checkpoint",
           "global_batch_input", "inputs_of"]

logger = logging.getLogger("towerlib")

# The graph collection of every GlobalBatchInput built in a graph.
COLLECTION = "towerlib_global_batch_inputs"
# Keeps the example permutations apart from other users of the same seed.
_SHUFFLE_SALT = 0x67626174
_STATE = ("seed", "global_batch_size", "examples_before", "batches_read")


@dataclasses.dataclass(frozen=True)
class FixedLengthRecords:
    """Record files of equal-size records, read by index (e.g. CIFAR-10's binary files).

    Every file's bytes are loaded into memory once per process (CIFAR-10's
    training files: 154 MB), so any record can be read by its index.

    Attributes:
      paths: a file, a directory, a glob pattern or a list of them (checked
        by towerlib.check_record_files: every size a multiple of record_bytes).
      record_bytes: bytes per record (CIFAR-10: 3073).
      decode: record (a tf.string scalar of record_bytes bytes) -> one example,
        a nest of tensors (e.g. (image uint8 [32, 32, 3], label int32 [])).
    """

    paths: Any
    record_bytes: int
    decode: Callable

    def load(self):
        """uint8 [records, record_bytes]: every record of every file, in file order."""
        found = data_checks.check_record_files(self.paths, self.record_bytes)
        parts = [np.fromfile(path, np.uint8).reshape([-1, self.record_bytes])
                 for path in found.paths]
        return np.concatenate(parts, axis=0)


@dataclasses.dataclass(frozen=True)
class GlobalBatchInput:
    """What global_batch_input built; found in a graph by inputs_of(graph).

    Attributes:
      name, seed, global_batch_size, allow_new_global_batch: as given.
      num_examples: n, the examples of one epoch.
      slice_bounds: [start, end) of this worker's slice of each global batch.
      variables: {state name: its variable}: seed, global_batch_size,
        examples_before, batches_read.
      initializer: (re)starts the iterator at the saved position.
    """

    name: str
    seed: int
    global_batch_size: int
    allow_new_global_batch: bool
    num_examples: int
    slice_bounds: tuple
    variables: dict
    initializer: Any

    def saved_names(self):
        return {key: variable.op.name for key, variable in self.variables.items()}


def global_batch_input(source, global_batch_size, *, seed, workers=None, augment=None,
                       allow_new_global_batch=False, name="global_batches"):
    """This worker's slice of the global batch of the current step, as tensors.

    Args:
      source: a nest of numpy arrays sharing dimension 0 (the n examples), or
        a FixedLengthRecords.
      global_batch_size: B, the examples of one optimizer step, whole job.
      seed: an int: the permutation of every epoch and the augmentation.
      workers: a towerlib.WorkerGroup (this worker reads its own slice), or
        None: this process reads the whole global batch.
      augment: (example, seed) -> example, with `seed` an int64 [2] tensor
        for stateless random ops (tf.image.stateless_random_*), or None.
      allow_new_global_batch: resume a checkpoint written with another
        global batch size: the position carries on, counted in examples
        (scale the learning rate with the batch: docs/distributed.md).
      name: the variable scope of the saved position.

    Returns:
      A nest shaped like one example, each tensor with a static leading
      dimension: this worker's share of B. Read it once per step (it is what
      build_train_graph splits over the towers).
    """
    workers = _checked_options(global_batch_size, seed, workers)
    with tf.compat.v1.variable_scope(name), tf.device("/cpu:0"):
        arrays, decode = _arrays_of(source)
        num_examples = int(tf.nest.flatten(arrays)[0].shape[0])
        if num_examples < 1:
            raise ValueError(f"global_batch_input({name!r}): the source holds no example.")
        sizes = inputs_lib.shard_sizes(global_batch_size, workers.num_workers)
        start = sum(sizes[:workers.worker_index])
        bounds = (start, start + sizes[workers.worker_index])
        variables = _state_variables(seed, global_batch_size)
        first = _first_position(variables, seed, global_batch_size, allow_new_global_batch,
                                name)
        dataset = _dataset(arrays, decode, augment, first, seed, global_batch_size,
                           bounds, num_examples)
        iterator = tf.compat.v1.data.make_initializable_iterator(dataset)
        next_element = iterator.get_next()
        with tf.control_dependencies([variables["batches_read"].assign_add(1)]):
            batch = tf.nest.map_structure(tf.identity, next_element)
    built = GlobalBatchInput(name, int(seed), int(global_batch_size),
                             bool(allow_new_global_batch), num_examples, bounds,
                             variables, iterator.initializer)
    _register(built, next_element)
    return batch


def _checked_options(global_batch_size, seed, workers):
    """The WorkerGroup to read for; refuses a bad batch size, seed or group."""
    if isinstance(global_batch_size, bool) or not isinstance(
            global_batch_size, numbers.Integral) or global_batch_size < 1:
        raise ValueError(f"global_batch_input: global_batch_size={global_batch_size!r}; "
                         "give the examples of one step, whole job, an int >= 1.")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) \
            or not 0 <= seed < 2**63:
        raise ValueError(f"global_batch_input: seed={seed!r}; give an int in [0, 2**63): "
                         "the run's data order is a function of it.")
    workers = ONE_WORKER if workers is None else workers
    if not isinstance(workers, WorkerGroup):
        raise TypeError(f"global_batch_input: workers must be a towerlib.WorkerGroup or "
                        f"None, got {type(workers).__name__}.")
    if global_batch_size < workers.num_workers:
        raise ValueError(
            f"global_batch_input: global_batch_size={global_batch_size} is fewer than the "
            f"{workers.num_workers} workers, so some worker would read no example. Fix: "
            "a global batch of at least one example per worker.")
    return workers


def _arrays_of(source):
    """(a nest of arrays indexed by example, decode or None)."""
    if isinstance(source, FixedLengthRecords):
        return source.load(), source.decode
    flat = tf.nest.flatten(source)
    if not flat or not all(isinstance(a, np.ndarray) and a.ndim >= 1 for a in flat):
        raise TypeError(
            "global_batch_input: source must be a nest of numpy arrays with a leading "
            "example dimension (e.g. (images, labels)) or a towerlib.FixedLengthRecords; "
            f"got {type(source).__name__}.")
    counts = {a.shape[0] for a in flat}
    if len(counts) > 1:
        raise ValueError(f"global_batch_input: the source's arrays disagree on the number "
                         f"of examples (dimension 0): {sorted(counts)}.")
    return source, None


def _state_variables(seed, global_batch_size):
    def variable(key, value):
        return tf.compat.v1.get_variable(
            key, initializer=tf.constant(value, tf.int64), trainable=False,
            use_resource=True, collections=[tf.compat.v1.GraphKeys.GLOBAL_VARIABLES])
    values = dict(seed=seed, global_batch_size=global_batch_size, examples_before=0,
                  batches_read=0)
    return {key: variable(key, values[key]) for key in _STATE}


def _first_position(variables, seed, global_batch_size, allow_new_global_batch, name):
    """int64 scalar: the position of the next batch to read.

    A checkpoint of another global batch (allowed) is rebased: the batches it
    read fold into examples_before, and the new size is recorded. The same
    global batch leaves the counters as they are, so a resumed run saves the
    very numbers an uninterrupted one does.
    """
    checks = [tf.debugging.assert_equal(
        variables["seed"].read_value(), tf.constant(seed, tf.int64), message=(
            f"global_batch_input({name!r}): the restored checkpoint was written with "
            f"another seed than seed={seed}; resuming would change every later batch. "
            "Fix: the checkpoint's seed, or another train_dir"))]
    if not allow_new_global_batch:
        checks.append(tf.debugging.assert_equal(
            variables["global_batch_size"].read_value(),
            tf.constant(global_batch_size, tf.int64), message=(
                f"global_batch_input({name!r}): the restored checkpoint was written with "
                f"another global batch than {global_batch_size}. Fix: its global batch, or "
                "allow_new_global_batch=True (docs/distributed.md)")))
    with tf.control_dependencies(checks):
        saved_batch = variables["global_batch_size"].read_value()
        before = variables["examples_before"].read_value()
        read = variables["batches_read"].read_value()
    position = before + read * saved_batch
    same = tf.equal(saved_batch, global_batch_size)
    with tf.control_dependencies([position, same]):  # every read before any write
        assigns = [variables["examples_before"].assign(tf.where(same, before, position)),
                   variables["batches_read"].assign(tf.where(same, read, tf.zeros_like(read))),
                   variables["global_batch_size"].assign(global_batch_size)]
    with tf.control_dependencies(assigns):
        return tf.identity(position)


def _dataset(arrays, decode, augment, first, seed, global_batch_size, bounds, n):
    """batch j of this worker: positions first + j * B + [start, end) of the stream."""
    start, end = bounds
    size = end - start
    flat = tf.nest.flatten(arrays)

    def examples_of(j):
        positions = first + j * global_batch_size + tf.range(start, end, dtype=tf.int64)
        epochs = positions // n
        seeds = tf.stack([tf.fill([size], tf.constant(seed, tf.int64)), epochs,
                          tf.fill([size], tf.constant(_SHUFFLE_SALT, tf.int64))], axis=1)
        examples = index_shuffle.shuffled_indices(positions % n, seeds, n - 1)
        # The augmentation's key: (seed, epoch, example), one int64 pair.
        keys = tf.stack([tf.fill([size], tf.constant(seed, tf.int64)),
                         epochs * n + examples], axis=1)
        return examples, keys

    def read(examples, keys):
        if decode is not None:  # records: each row as the bytes decode expects
            values = [tf.numpy_function(
                lambda e: np.array([row.tobytes() for row in flat[0][e]], dtype=object),
                [examples], tf.string, stateful=False)]
            values = [tf.ensure_shape(values[0], [size])]
        else:
            values = tf.numpy_function(lambda e: tuple(a[e] for a in flat), [examples],
                                       [tf.as_dtype(a.dtype) for a in flat], stateful=False)
            values = [tf.ensure_shape(v, [size, *a.shape[1:]]) for v, a in zip(values, flat)]
        return tf.nest.pack_sequence_as(arrays, values), keys

    dataset = tf.data.Dataset.range(np.iinfo(np.int64).max).map(examples_of).map(read)
    if decode is not None or augment is not None:
        def one(example, key):
            if decode is not None:
                example = decode(example)
            return augment(example, key) if augment is not None else example
        dataset = dataset.unbatch().map(one, num_parallel_calls=tf.data.AUTOTUNE,
                                        deterministic=True)
        dataset = dataset.batch(size, drop_remainder=True)
    else:
        dataset = dataset.map(lambda example, key: example)
    return dataset.prefetch(2)


def _register(built, next_element):
    graph = tf.compat.v1.get_default_graph()
    graph.add_to_collection(COLLECTION, built)
    # Scaffold's default local_init_op runs this collection after restoring; the
    # LOCAL_INIT_OP collection would replace that default op instead of joining it.
    graph.add_to_collection(tf.compat.v1.GraphKeys.TABLE_INITIALIZERS, built.initializer)
    graph.add_to_collection(inputs_lib.INPUT_INITIALIZERS, built.initializer)
    data_position.mark_positioned(next_element)


def inputs_of(graph):
    """The GlobalBatchInputs built in `graph`."""
    return list(graph.get_collection(COLLECTION))


def check_checkpoint(graph, prefix):
    """Raises CheckpointError (one line) when `prefix` cannot resume `graph`'s inputs.

    Reads the saved seed and global batch size, no weights: run it before
    anything in the run folder changes. Returns a line describing the
    resumed position when the global batch changes (allowed), else None.
    """
    if prefix is None or not inputs_of(graph):
        return None
    reader = tf.compat.v1.train.NewCheckpointReader(prefix)
    held = reader.get_variable_to_shape_map()
    said = None
    for built in inputs_of(graph):
        names = built.saved_names()
        if any(saved not in held for saved in names.values()):
            raise CheckpointError(
                f"The checkpoint {prefix} holds no position of the global batch input "
                f"{built.name!r} (it was written by another input pipeline), so resuming "
                "cannot continue its trajectory. Fix: train into another train_dir, or "
                "restore_from=None to start afresh.")
        saved = {key: int(reader.get_tensor(saved)) for key, saved in names.items()}
        said = _check_saved(prefix, built, saved) or said
    return said


def _check_saved(prefix, built, saved):
    if saved["seed"] != built.seed:
        raise CheckpointError(
            f"The checkpoint {prefix} was trained with seed={saved['seed']} and this run's "
            f"input has seed={built.seed}: every later global batch would differ. Fix: "
            f"seed={saved['seed']}, or another train_dir.")
    old = saved["global_batch_size"]
    if old == built.global_batch_size:
        return None
    position = saved["examples_before"] + saved["batches_read"] * old
    if not built.allow_new_global_batch:
        raise CheckpointError(
            f"The checkpoint {prefix} was trained with a global batch of {old} examples "
            f"and this run's is {built.global_batch_size}: another computation. Fix: "
            f"global_batch_size={old} (any number of workers or towers keeps it), or "
            "allow_new_global_batch=True to go on from its example position with "
            f"the new batch (scale the learning rate by {built.global_batch_size}/{old}).")
    return (f"Resuming {prefix} at example {position} with a global batch of "
            f"{built.global_batch_size} (it was {old}): scale the learning rate by "
            f"{built.global_batch_size}/{old}.")

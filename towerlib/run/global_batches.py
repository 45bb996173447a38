"""An input whose global batch at each step is a function of the seed and the position.

    images, labels = towerlib.global_batch_input((train_images, train_labels), 128,
                                                 seed=1, workers=group, augment=flip)
    train = towerlib.build_train_graph(model, (images, labels), optimizer, ...)

The run reads one endless stream of example positions; the order (which
example each position is, and its augmentation seed) is
towerlib/data/order.py's, which `towerlib.global_batch_examples` computes
outside a run: every epoch a fresh permutation of the n examples, computed
from the index alone (no shuffle buffer). The global batch of a step is the
next B positions; worker r of W reads only its contiguous slice of them (the
first B % W workers one example more, as towerlib splits a batch over
towers), and its towers split that slice as usual. So the examples of every
step and their randomness depend on the seed and the position alone: not on
the number of workers, towers or accumulation micro-batches, and a run
resumed on another topology trains on the same global batches as one that
never stopped.

The sources (towerlib/data/sources.py): numpy arrays, or record files read
by index with tf.data ops (TFRecords, FixedLengthRecords), memory bounded by
the prefetched batches and the reads in flight, not by the data's size.

The saved state is six int64 variables under `name/` in every checkpoint:
the seed, the global batch size, the examples read before the global batch
last changed (0 unless allow_new_global_batch resumed another size), the
batches read since, and the source's identity: its number of examples and
its fingerprint. A batch counts when the step reads it (a float16 step
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
index.
"""

import dataclasses
import logging
import numbers
import os
from typing import Any

import numpy as np
import tensorflow as tf

from towerlib.data import order, sources
from towerlib.data.sources import FixedLengthRecords, TFRecords
from towerlib.exchange.group import ONE_WORKER, WorkerGroup
from towerlib.run import data_position
from towerlib.run.checkpoint_state import CheckpointError
from towerlib.step import inputs as inputs_lib

__all__ = ["FixedLengthRecords", "GlobalBatchInput", "TFRecords", "check_checkpoint",
           "global_batch_input", "inputs_of"]

logger = logging.getLogger("towerlib")

# The graph collection of every GlobalBatchInput built in a graph.
COLLECTION = "towerlib_global_batch_inputs"
_STATE = ("seed", "global_batch_size", "examples_before", "batches_read", "num_examples",
          "source_fingerprint")
# Batches prefetched ahead of the step: with the reads in flight, what bounds memory.
PREFETCH_BATCHES = 2
# Examples of a record source read (and decoded, augmented) at once. A positioned read
# waits on the file system more than it computes, so more of them than cores: tf.data's
# autotuning, which sizes a map by its CPU time, kept about 2 on 2 cores and read 0.61x
# as fast as a sequential stream; 32 read 1.26x (bench/bench_record_input.py, 2 cores).
# In one map: a second, autotuned map for the decoding held the reads back again. On a
# host of more cores, one per core, so decoding is never held below it. Memory: this
# many examples, decoded.
READS_IN_FLIGHT = max(32, os.cpu_count() or 1)


@dataclasses.dataclass(frozen=True)
class GlobalBatchInput:
    """What global_batch_input built; found in a graph by inputs_of(graph).

    Attributes:
      name, seed, global_batch_size, allow_new_global_batch, allow_new_source:
        as given.
      num_examples: n, the examples of one epoch.
      fingerprint: the source's identity (an int64; towerlib/data/sources.py).
      slice_bounds: [start, end) of this worker's slice of each global batch.
      variables: {state name: its variable} (the module docstring's six).
      initializer: (re)starts the iterator at the saved position.
    """

    name: str
    seed: int
    global_batch_size: int
    allow_new_global_batch: bool
    allow_new_source: bool
    num_examples: int
    fingerprint: int
    slice_bounds: tuple
    variables: dict
    initializer: Any

    def saved_names(self):
        return {key: variable.op.name for key, variable in self.variables.items()}


def global_batch_input(source, global_batch_size, *, seed, workers=None, augment=None,
                       allow_new_global_batch=False, allow_new_source=False,
                       name="global_batches"):
    """This worker's slice of the global batch of the current step, as tensors.

    Args:
      source: a nest of numpy arrays sharing dimension 0 (the n examples), a
        towerlib.TFRecords or a towerlib.FixedLengthRecords.
      global_batch_size: B, the examples of one optimizer step, whole job.
      seed: an int: the permutation of every epoch and the augmentation.
      workers: a towerlib.WorkerGroup (this worker reads its own slice), or
        None: this process reads the whole global batch.
      augment: (example, seed) -> example, with `seed` an int64 [2] tensor
        for stateless random ops (tf.image.stateless_random_*), or None.
      allow_new_global_batch: resume a checkpoint written with another
        global batch size: the position carries on, counted in examples
        (scale the learning rate with the batch: docs/distributed.md).
      allow_new_source: resume a checkpoint written on another source (other
        n or fingerprint): the position carries on in the new source's
        order, another run from there on (docs/distributed.md).
      name: the variable scope of the saved position.

    Returns:
      A nest shaped like one example, each tensor with a static leading
      dimension: this worker's share of B. Read it once per step (it is what
      build_train_graph splits over the towers).
    """
    workers = _checked_options(global_batch_size, seed, workers)
    source = sources.as_source(source)
    num_examples = source.num_examples
    if num_examples < 1:
        raise ValueError(f"global_batch_input({name!r}): the source holds no example.")
    bounds = order.slice_bounds(global_batch_size, workers.num_workers, workers.worker_index)
    identity = dict(seed=int(seed), global_batch_size=int(global_batch_size),
                    num_examples=num_examples, source_fingerprint=source.fingerprint)
    with tf.compat.v1.variable_scope(name), tf.device("/cpu:0"):
        variables = _state_variables(identity)
        first = _first_position(variables, identity, allow_new_global_batch,
                                allow_new_source, name)
        refusals = []
        checked = None if augment is None else _refusing_stateful_ops(augment, refusals)
        try:
            dataset = _dataset(source, checked, first, seed, global_batch_size, bounds)
        except Exception:  # noqa: BLE001 -- tf.data's wrapping of augment's refusal
            if refusals:  # said once, not as tf.data's "in user code" traceback
                raise ValueError(f"global_batch_input({name!r}): {refusals[0]}") from None
            raise
        iterator = tf.compat.v1.data.make_initializable_iterator(dataset)
        next_element = iterator.get_next()
        with tf.control_dependencies([variables["batches_read"].assign_add(1)]):
            batch = tf.nest.map_structure(tf.identity, next_element)
    built = GlobalBatchInput(name, int(seed), int(global_batch_size),
                             bool(allow_new_global_batch), bool(allow_new_source),
                             num_examples, source.fingerprint, bounds, variables,
                             iterator.initializer)
    _register(built, next_element)
    return batch


def _refusing_stateful_ops(augment, refusals):
    """`augment`, refusing (when tf.data traces it) a stateful random op among the ops it
    makes: its draws would depend on the run, not on the seed and the position. The
    refusal's text is also appended to `refusals`."""
    def checked(example, key):
        graph = tf.compat.v1.get_default_graph()
        before = len(graph.get_operations())
        result = augment(example, key)
        stateful = sorted({op.type for op in graph.get_operations()[before:]
                           if op.op_def is not None and op.op_def.is_stateful
                           and ("Random" in op.type or op.type.startswith("Stateful")
                                or op.type in ("TruncatedNormal", "Multinomial"))})
        if stateful:
            refusals.append(
                f"augment uses {', '.join(stateful)}, a stateful random op, so two runs "
                "of the same seed would draw differently. Fix: stateless ops keyed by "
                "augment's second argument, e.g. "
                "tf.image.stateless_random_flip_left_right(image, seed) or "
                "tf.random.stateless_uniform(shape, seed).")
            raise ValueError(refusals[-1])
        return result
    return checked


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


def _state_variables(identity):
    def variable(key, value):
        return tf.compat.v1.get_variable(
            key, initializer=tf.constant(value, tf.int64), trainable=False,
            use_resource=True, collections=[tf.compat.v1.GraphKeys.GLOBAL_VARIABLES])
    values = dict(identity, examples_before=0, batches_read=0)
    return {key: variable(key, values[key]) for key in _STATE}


def _first_position(variables, identity, allow_new_global_batch, allow_new_source, name):
    """int64 scalar: the position of the next batch to read.

    A checkpoint of another global batch (allowed) is rebased: the batches it
    read fold into examples_before, and the new size is recorded; another
    source (allowed) is recorded as this one. The same global batch leaves
    the counters as they are, so a resumed run saves the very numbers an
    uninterrupted one does. The asserts back check_checkpoint's one-line
    refusals for a Saver.restore of one's own.
    """
    def must_equal(key, what):
        return tf.debugging.assert_equal(
            variables[key].read_value(), tf.constant(identity[key], tf.int64), message=(
                f"global_batch_input({name!r}): the restored checkpoint (or the chief's "
                f"broadcast) has another {what} than this input's {identity[key]}; "
                "resuming would change every later batch. Fix: the same "
                f"{what}, or another train_dir"))
    checks = [must_equal("seed", "seed")]
    if not allow_new_global_batch:
        checks.append(must_equal("global_batch_size", "global batch"))
    if not allow_new_source:
        checks += [must_equal("num_examples", "number of examples"),
                   must_equal("source_fingerprint", "source fingerprint")]
    batch_size = identity["global_batch_size"]
    with tf.control_dependencies(checks):
        saved_batch = variables["global_batch_size"].read_value()
        before = variables["examples_before"].read_value()
        read = variables["batches_read"].read_value()
    position = before + read * saved_batch
    same = tf.equal(saved_batch, batch_size)
    with tf.control_dependencies([position, same]):  # every read before any write
        assigns = [variables["examples_before"].assign(tf.where(same, before, position)),
                   variables["batches_read"].assign(tf.where(same, read, tf.zeros_like(read)))]
        assigns += [variables[key].assign(identity[key]) for key in (
            "global_batch_size", "num_examples", "source_fingerprint")]
    with tf.control_dependencies(assigns):
        return tf.identity(position)


def _dataset(source, augment, first, seed, global_batch_size, bounds):
    """batch j of this worker: positions first + j * B + [start, end) of the stream."""
    start, end = bounds
    size = end - start
    n = source.num_examples

    def examples_of(j):
        positions = first + j * global_batch_size + tf.range(start, end, dtype=tf.int64)
        return order.positions_examples(positions, seed, n)

    batches = tf.data.Dataset.range(np.iinfo(np.int64).max).map(examples_of)
    if isinstance(source, sources.ArraySource):
        return _array_batches(batches, source.arrays, augment, size).prefetch(
            PREFETCH_BATCHES)
    if isinstance(source, FixedLengthRecords) and source.in_memory:
        rows = source.load()

        def records(examples, keys):
            found = tf.numpy_function(
                lambda e: np.array([row.tobytes() for row in rows[e]], dtype=object),
                [examples], tf.string, stateful=False)
            return tf.ensure_shape(found, [size]), keys
        batches, fetch, parallel = batches.map(records), tf.identity, tf.data.AUTOTUNE
    else:  # each example's record read by tf.data ops, READS_IN_FLIGHT at a time
        fetch, parallel = source.record_reader(), READS_IN_FLIGHT

    def one(item, key):
        value = fetch(item)
        if source.decode is not None:
            value = source.decode(value)
        return augment(value, key) if augment is not None else value
    dataset = batches.unbatch().map(one, num_parallel_calls=parallel, deterministic=True)
    return dataset.batch(size, drop_remainder=True).prefetch(PREFETCH_BATCHES)


def _array_batches(batches, arrays, augment, size):
    flat = tf.nest.flatten(arrays)

    def read(examples, keys):
        values = tf.numpy_function(lambda e: tuple(a[e] for a in flat), [examples],
                                   [tf.as_dtype(a.dtype) for a in flat], stateful=False)
        values = [tf.ensure_shape(v, [size, *a.shape[1:]]) for v, a in zip(values, flat)]
        return tf.nest.pack_sequence_as(arrays, values), keys
    dataset = batches.map(read)
    if augment is None:
        return dataset.map(lambda example, key: example)
    dataset = dataset.unbatch().map(augment, num_parallel_calls=tf.data.AUTOTUNE,
                                    deterministic=True)
    return dataset.batch(size, drop_remainder=True)


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

    Reads the saved seed, global batch size and source identity, no weights:
    run it before anything in the run folder changes. Returns a line
    describing the resumed position when the global batch or the source
    changes (allowed), else None.
    """
    if prefix is None or not inputs_of(graph):
        return None
    reader = tf.compat.v1.train.NewCheckpointReader(prefix)
    held = reader.get_variable_to_shape_map()
    said = []
    for built in inputs_of(graph):
        names = built.saved_names()
        if any(saved not in held for saved in names.values()):
            missing = sorted(k for k, saved in names.items() if saved not in held)
            raise CheckpointError(
                f"The checkpoint {prefix} holds no {', '.join(missing)} of the global batch "
                f"input {built.name!r} (it was written by another input pipeline, or by a "
                "towerlib that saved no source identity), so resuming cannot continue its "
                "trajectory. Fix: train into another train_dir, or restore_from=None to "
                "start afresh.")
        saved = {key: int(reader.get_tensor(saved)) for key, saved in names.items()}
        said += [line for line in (_check_saved(prefix, built, saved),
                                   _check_source(prefix, built, saved)) if line]
    return " ".join(said) or None


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


def _check_source(prefix, built, saved):
    old_n, old_print = saved["num_examples"], saved["source_fingerprint"]
    if (old_n, old_print) == (built.num_examples, built.fingerprint):
        return None
    what = (f"{old_n} examples and this run's {built.num_examples}"
            if old_n != built.num_examples else
            f"a source of fingerprint {old_print & (2**64 - 1):016x} and this run's "
            f"{built.fingerprint & (2**64 - 1):016x} (the same {old_n} examples' count, "
            "other files or contents)")
    if not built.allow_new_source:
        raise CheckpointError(
            f"The checkpoint {prefix} was trained on {what}: every later global batch "
            "would differ. Fix: the checkpoint's data, or another train_dir, or "
            "allow_new_source=True to go on from its position on this source "
            "(another run from there on).")
    return (f"Resuming {prefix} on another source ({what}): its position carries on in "
            "this source's order; the run is another computation from here on.")

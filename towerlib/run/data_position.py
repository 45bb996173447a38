"""The input pipeline's position, saved in every checkpoint with the weights.

A tf.data iterator keeps its position (the file offsets, the shuffle buffer
and its random state, what is prefetched) in memory only. A job restarted
from a checkpoint therefore starts its data from the beginning again: a run
preempted again and again trains on the start of its shuffle order over and
over, and a seeded restart replays the order it already trained on. Resuming
is then not the same computation as running on.

`saved_position_iterator(dataset)` makes a graph-mode iterator whose state is
a saveable object in the graph's SAVEABLE_OBJECTS collection. Every
`tf.compat.v1.train.Saver` built without an explicit var_list (the default
Scaffold's, hence every checkpoint `towerlib.run_training` writes) saves it
next to the variables and restores it with them, so a restarted run reads
exactly the batch it would have read had it not stopped.

TensorFlow serializes the pipeline to save it, which it refuses for a
pipeline that calls stateful random ops (`tf.image.random_flip_left_right`,
`tf.random.uniform`, ...): their state lives outside the pipeline. Use the
stateless ops (`tf.image.stateless_random_*`, `tf.random.stateless_*`) with
a per-element seed, e.g. zipped from `tf.data.Dataset.random(seed)`, whose
stream is part of the saved state. That is checked here, when the iterator
is made, rather than at the first save minutes into the run.

What the state costs: the shuffle buffer's elements and the prefetched
batches are stored in each checkpoint (a `cache()` in memory stores the
whole cache: prefer reading the files again).

Its limits: the state is one process's pipeline, tied to its shard of the
data and so to the number of workers; a resume on another number of workers
cannot restore it. Where the examples can be read by index (arrays,
TFRecord shards, fixed-length records), `towerlib.global_batch_input` saves six numbers
instead and resumes on any topology (towerlib/run/global_batches.py).
"""

import tensorflow as tf

from towerlib.checks import graph_walk
from towerlib.internals import deprecations

__all__ = ["DataPositionError", "check_saveable_pipeline", "saved_position_iterator",
           "unsaved_iterators"]

# The ops that read an iterator's next element; their first input is the iterator.
_GET_NEXT_TYPES = frozenset({"IteratorGetNext", "IteratorGetNextSync",
                             "IteratorGetNextAsOptional"})

# The iterators whose position variables hold (towerlib.global_batch_input): by name.
_POSITIONED = "towerlib_positioned_iterators"

# tf.raw_ops.DatasetToGraphV2's external_state_policy: raise on external state.
_FAIL_ON_EXTERNAL_STATE = 2


class DataPositionError(ValueError):
    """The pipeline's position cannot be saved; the message names the fix."""


def check_saveable_pipeline(dataset):
    """Raises DataPositionError when `dataset` holds state that cannot be saved.

    Serializes the pipeline the way a checkpoint will, in a throwaway session
    on the dataset's graph. A pipeline that cannot be built here (it reads a
    placeholder, say) is left to the first save to judge.
    """
    graph = tf.compat.v1.get_default_graph()
    with graph.as_default(), tf.name_scope("check_saveable_pipeline"):
        serialize = tf.raw_ops.DatasetToGraphV2(
            input_dataset=tf.data.experimental.to_variant(dataset),
            external_state_policy=_FAIL_ON_EXTERNAL_STATE,
            strip_device_assignment=True)
    with tf.compat.v1.Session(graph=graph) as session:
        try:
            session.run(serialize.op)
        except tf.errors.FailedPreconditionError as error:
            if "stateful" not in error.message:
                return
            # TensorFlow's text: "... input pipeline graph: RandomUniform is stateful."
            op_name = next((line.split(": ")[-1].rstrip(".") for line in
                            error.message.splitlines() if "is stateful" in line),
                           "an op is stateful")
            raise DataPositionError(
                f"The input pipeline's position cannot be saved in checkpoints: "
                f"{op_name} (a stateful random op in a map or filter function). "
                "Fix: use stateless random ops with a per-element seed, e.g. "
                "tf.image.stateless_random_flip_left_right(image, seed) with seeds "
                "from tf.data.Dataset.random(seed).batch(2) zipped to the dataset "
                "(see towerlib/run/data_position.py).") from None
        except tf.errors.OpError:
            return


def saved_position_iterator(dataset, check=True):
    """A one-shot iterator over `dataset` whose position every checkpoint holds.

    Call it in graph mode, in the graph of the training step, before the
    Saver is built (run_training builds it): the iterator's state joins the
    SAVEABLE_OBJECTS collection, so checkpoints save it and a restore puts
    the iterator back where it was. A one-shot iterator needs no initializer,
    so a restore (which runs before any init op) finds it ready.

    Args:
      dataset: a tf.data.Dataset without stateful random ops.
      check: refuse a pipeline that cannot be saved now (DataPositionError)
        rather than at the first checkpoint.

    Returns:
      A tf.compat.v1.data.Iterator; call get_next() for the batch tensors.

    Raises:
      DataPositionError: the pipeline holds a stateful random op.
    """
    if tf.executing_eagerly():
        raise RuntimeError(
            "saved_position_iterator builds a graph-mode iterator; call it inside "
            "`with tf.Graph().as_default():` (eagerly, save the iterator with "
            "tf.train.Checkpoint(iterator=iter(dataset)) instead).")
    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError(f"saved_position_iterator takes a tf.data.Dataset, got "
                        f"{type(dataset).__name__}. Fix: e.g. "
                        "tf.data.Dataset.from_tensor_slices(values).")
    if check:
        check_saveable_pipeline(dataset)
    iterator = tf.compat.v1.data.make_one_shot_iterator(dataset)
    with deprecations.silenced():  # the only graph-mode way to save the position
        saveable = tf.data.experimental.make_saveable_from_iterator(iterator)
    tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS, saveable)
    return iterator


def mark_positioned(next_element):
    """Records that the iterator `next_element` (its get_next()) reads restarts at a
    position saved in variables: unsaved_iterators does not name it."""
    get_next = tf.nest.flatten(next_element)[0].op
    source = graph_walk.source_op(get_next.inputs[0].op)
    tf.compat.v1.add_to_collection(_POSITIONED, source.name)


def unsaved_iterators(fetch):
    """The names of the iterators `fetch` reads whose position no checkpoint saves.

    A restart from a checkpoint starts such an iterator from its beginning (the
    run replays data it trained on); saved_position_iterator's are saved.
    """
    saved = set(fetch.graph.get_collection(_POSITIONED))
    for saveable in fetch.graph.get_collection(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS):
        resource = getattr(saveable, "op", None)
        if resource is not None:
            saved.add(getattr(resource, "op", resource).name)
    found = []
    for op in graph_walk.upstream_ops([fetch], lambda op: True):
        if op.type in _GET_NEXT_TYPES and op.inputs:
            iterator = graph_walk.source_op(op.inputs[0].op)
            if iterator.name not in saved and iterator.name not in found:
                found.append(iterator.name)
    return found

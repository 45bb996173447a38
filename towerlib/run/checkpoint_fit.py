"""Whether a checkpoint fits a graph: every saved variable there, of its shape and dtype.

A resource variable restored from a tensor of another shape takes that shape
without a word; the step then fails (an ABORTED error in a gradient op, which
MonitoredSession treats as a lost ps task) or, for a layer whose shape only
the next op's broadcast sees, trains and saves another model. So the names,
shapes and dtypes the saver would restore are compared with the checkpoint's
index (no value is read) before any session exists.

One misfit is a plan, not a refusal: a checkpoint that lacks only the
optimizer slots and moving averages of variables it holds (fine-tuning:
phase 1 trained a head over a frozen base, phase 2 unfroze the base's top)
restores every value it has; the new slots start from their initial values
(zeros) and a new moving average from its variable's restored value, as
ExponentialMovingAverage starts one (`plan_restore`).
"""

import dataclasses
import logging

import tensorflow as tf

from towerlib.internals import saver_names
from towerlib.run.checkpoint_state import CheckpointError

__all__ = ["PartialRestore", "check_fits_graph", "mismatches", "plan_restore"]

logger = logging.getLogger("towerlib")

_SHOWN = 3  # mismatches named in the first line


def _saved_objects(saver):
    """The saver's var_list, or what the Scaffold's default saver saves."""
    var_list = getattr(saver, "_var_list", None) if saver is not None else None
    if var_list is None:
        var_list = (tf.compat.v1.global_variables()
                    + tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS))
    return saver_names.saver_names(var_list)


def _expected(saved):
    """(shape as a list or None, dtype or None) of one entry of the saver's dict."""
    if isinstance(saved, (list, tuple)):  # a partitioned variable's slices
        info = getattr(saved[0], "_save_slice_info", None)
        return (list(info.full_shape) if info else None), saved[0].dtype.base_dtype
    if not hasattr(saved, "shape") or not hasattr(saved, "dtype"):
        return None, None
    shape = saved.shape
    shape = shape.as_list() if shape.is_fully_defined() else None
    return shape, saved.dtype.base_dtype


def mismatches(prefix, saver=None):
    """One text per variable of the default graph that `prefix` does not fit, in order.

    E.g. 'conv1/weights: [5, 5, 3, 4] in the checkpoint, [5, 5, 3, 8] in the
    graph' or 'logits/biases: missing from the checkpoint'. Data positions
    and other saveable objects are checked by their tensors' names.
    """
    return [text for _, text in _mismatches(prefix, saver)]


def _mismatches(prefix, saver=None):
    """[(saver name, text)] of mismatches(): the name, for plan_restore."""
    reader = tf.compat.v1.train.NewCheckpointReader(prefix)
    shapes, dtypes = reader.get_variable_to_shape_map(), reader.get_variable_to_dtype_map()
    found = []
    for name, saved in sorted(_saved_objects(saver).items()):
        specs = getattr(saved, "specs", None)
        if specs is not None:  # a SaveableObject: its tensors' names
            absent = [spec.name for spec in specs if spec.name not in shapes]
            if absent:
                found.append((None, f"{absent[0]}: missing from the checkpoint"))
            continue
        if name not in shapes:
            found.append((name, f"{name}: missing from the checkpoint"))
            continue
        shape, dtype = _expected(saved)
        if shape is not None and list(shapes[name]) != shape:
            found.append((None, f"{name}: {list(shapes[name])} in the checkpoint, "
                                f"{shape} in the graph"))
        elif dtype is not None and dtypes[name] != dtype:
            found.append((None, f"{name}: {dtypes[name].name} in the checkpoint, "
                                f"{dtype.name} in the graph"))
    return found


@dataclasses.dataclass(frozen=True)
class PartialRestore:
    """Restore `prefix` with `saver` (every value it has) after initializing the rest.

    `new_slots`: the optimizer slots the checkpoint lacks, of variables it holds.
    """

    prefix: str
    saver: object
    new_slots: tuple
    after_restore: object = None  # an op: each new moving average := its variable


def plan_restore(prefix, saver=None, trained=(), averages=None):
    """None when `prefix` fits the default graph, a PartialRestore when it lacks only the
    slots (and moving averages) of `trained` variables (names) it holds; else
    CheckpointError (check_fits_graph). `averages`: {moving average's name: its
    variable} (TrainGraph.ema's).

    Call it before the graph is finalized: a PartialRestore holds ops of its own.
    """
    if prefix is None:
        return None
    found = _readable_mismatches(prefix, saver)
    if not found:
        return None
    held = set(tf.compat.v1.train.NewCheckpointReader(prefix).get_variable_to_shape_map())
    slot_of = {f"{name}/": name for name in trained if name in held}
    new_slots = [name for name, _ in found if name is not None and any(
        name.startswith(variable) for variable in slot_of)]
    if len(new_slots) != len(found):
        _raise_misfit(prefix, [text for _, text in found])
    kept = {name: value for name, value in _saved_objects(saver).items()
            if name not in set(new_slots)}
    averages = averages or {}
    new_averages = [name for name in new_slots if name in averages]
    slots = [name for name in new_slots if name not in averages]
    logger.info("Restoring %s without the %d optimizer slots and %d moving averages it "
                "lacks (variables newly trained, e.g. unfrozen for fine-tuning: %s); the "
                "slots start from their initial values, the averages from their variables.",
                prefix, len(slots), len(new_averages), ", ".join(new_slots[:_SHOWN]))
    after = None
    if new_averages:
        variables = {v.op.name: v for v in tf.compat.v1.global_variables()}
        after = tf.group(*[variables[name].assign(averages[name].read_value())
                           for name in new_averages], name="new_moving_averages")
    return PartialRestore(prefix, tf.compat.v1.train.Saver(var_list=kept), tuple(new_slots),
                          after)


def check_fits_graph(prefix, saver=None):
    """Raises CheckpointError when the checkpoint at `prefix` does not fit the default graph.

    The first line names the checkpoint, up to three variables with both
    shapes (or dtypes) and the fix; the rest lists every mismatch.
    """
    if prefix is None:
        return
    found = _readable_mismatches(prefix, saver)
    if found:
        _raise_misfit(prefix, [text for _, text in found])


def _readable_mismatches(prefix, saver):
    try:
        return _mismatches(prefix, saver)
    except (tf.errors.OpError, ValueError, RuntimeError) as error:
        text = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
        raise CheckpointError(
            f"Cannot restore {prefix}: it is not a readable checkpoint ({text}). Fix: "
            "restore_from= a checkpoint prefix (e.g. '<dir>/model.ckpt-1000'), "
            "'newest', or None to start afresh.") from None


def _raise_misfit(prefix, found):
    more = f" (and {len(found) - _SHOWN} more)" if len(found) > _SHOWN else ""
    lines = [f"The checkpoint {prefix} does not fit this graph (another model, layer "
             f"width or optimizer): {'; '.join(found[:_SHOWN])}{more}. Fix: train into "
             "another train_dir, or pass restore_from=None (start afresh) or "
             "restore_from=<a checkpoint of this model>."]
    if len(found) > _SHOWN:
        lines += [f"  - {text}" for text in found]
    raise CheckpointError("\n".join(lines))

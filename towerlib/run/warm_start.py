"""Warm start: a fresh run's variables start from another run's checkpoint or a Keras file.

    towerlib.run_training(train, train_dir=..., max_steps=...,
                          warm_start_from=towerlib.WarmStart(
                              "/runs/base/model.ckpt-4000",          # or "base.h5"
                              names={"head/kernel": "logits/kernel"},  # {new: old}
                              include=r"^(?!head/bias)"))              # which new names

As tf.estimator.WarmStartSettings did: only on a fresh run (a resume
restores the run's own checkpoint, and the warm start is not used); the
model's variables only: optimizer slots (a variable under another one's
name, 'w/Momentum'), the global step, towerlib's own state and the
replicated copies (they read tower 0's) are left to their initializers.
Each variable found in the source with its shape starts from that value
(its initializer replaced; towerlib.internals.variable_initializers);
every other keeps its initializer. One log line says which, by count and name.

The source is a TF checkpoint prefix (tf.train.load_checkpoint) or a Keras
weights file (.h5, `model.save_weights`), whose names are the layer's
weight names ('conv/kernel:0' read as 'conv/kernel').
"""

import dataclasses
import logging
import os
import re
from typing import Dict, Optional

import numpy as np
import tensorflow as tf

from towerlib.internals import variable_initializers

logger = logging.getLogger("towerlib")

__all__ = ["WarmStart", "warm_start", "warm_start_problems"]

# towerlib's own state among the global variables: not the model's.
_OWN_STATE = re.compile(r"(^|/)(towerlib|global_step|data_position|loss_scale|"
                        r"input_position)(/|$|_)")


@dataclasses.dataclass(frozen=True)
class WarmStart:
    """Where a fresh run's variables start from (run_training's warm_start_from).

    Attributes:
      source: a TF checkpoint prefix ('.../model.ckpt-4000') or a Keras
        weights file ('.h5', from model.save_weights).
      names: {variable name in this graph: its name in the source}, for the
        renamed ones; the others are looked up under their own name.
      include: a regular expression; only the variables whose name (in this
        graph) it matches (re.search) are warm-started. Default: all.
    """

    source: str
    names: Optional[Dict[str, str]] = None
    include: str = ".*"


def as_warm_start(value):
    """WarmStart of run_training's `warm_start_from` (a WarmStart, a path, or None)."""
    if value is None or isinstance(value, WarmStart):
        return value
    return WarmStart(os.fspath(value))


def warm_start_problems(value):
    """[(option, problem, fix)] for a warm_start_from that cannot be read."""
    fix = ("give a checkpoint prefix, a Keras .h5 weights file, or "
           "towerlib.WarmStart(source, names={new: old}, include=regex).")
    if value is None:
        return []
    if not isinstance(value, (WarmStart, str, os.PathLike)):
        return [("warm_start_from", f"must be a path or a towerlib.WarmStart, got "
                 f"{type(value).__name__}.", fix)]
    start = as_warm_start(value)
    if not isinstance(start.names or {}, dict):
        return [("warm_start_from", "names must be a dict {new name: name in the source}.",
                 fix)]
    try:
        re.compile(start.include)
    except (re.error, TypeError) as error:
        return [("warm_start_from", f"include is not a regular expression: {error}.", fix)]
    if not (_is_keras_file(start.source) or tf.io.gfile.exists(start.source + ".index")):
        return [("warm_start_from", f"{start.source!r} is neither a TF checkpoint prefix "
                 "(no .index file) nor a Keras .h5 weights file.", fix)]
    return []


def _is_keras_file(path):
    return path.endswith((".h5", ".hdf5", ".keras")) and tf.io.gfile.exists(path)


def _keras_file_values(path):
    """{weight name without ':0': array} of a Keras weights file."""
    import h5py  # tf_keras' own dependency, needed only for this format
    values = {}
    with h5py.File(path, "r") as opened:
        group = opened["model_weights"] if "model_weights" in opened else opened
        for layer in group.attrs.get("layer_names", []):
            layer = layer.decode() if isinstance(layer, bytes) else layer
            for weight in group[layer].attrs.get("weight_names", []):
                weight = weight.decode() if isinstance(weight, bytes) else weight
                values[weight.split(":")[0]] = np.asarray(group[layer][weight])
    return values


class _Source:
    def __init__(self, path):
        self._keras = _keras_file_values(path) if _is_keras_file(path) else None
        self._reader = None if self._keras is not None else tf.train.load_checkpoint(path)
        self._shapes = ({k: v.shape for k, v in self._keras.items()} if self._keras is not None
                        else self._reader.get_variable_to_shape_map())

    def shape(self, name):
        shape = self._shapes.get(name)
        return None if shape is None else tuple(shape)

    def value(self, name):
        return self._keras[name] if self._keras is not None else self._reader.get_tensor(name)


def model_variables(graph, global_step):
    """The graph's global variables that are the model's: no optimizer slot (a variable
    named under another's), no global step, none of towerlib's own state."""
    variables = graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
    names = {v.op.name for v in variables}
    step = getattr(global_step, "op", None)
    return [v for v in variables
            if v.op is not step and not _OWN_STATE.search(v.op.name)
            and not any(v.op.name[:i] in names for i in _slashes(v.op.name))]


def _slashes(name):
    return [i for i, c in enumerate(name) if c == "/"]


def warm_start(graph, value, global_step):
    """Replaces the initializers of the model's variables found in the source; logs what.

    Returns (the names warm-started, the names left at their initializer).
    """
    start = as_warm_start(value)
    source = _Source(start.source)
    names, include = start.names or {}, re.compile(start.include)
    loaded, left = [], []
    for variable in model_variables(graph, global_step):
        name = variable.op.name
        old = names.get(name, name)
        if include.search(name) and source.shape(old) == tuple(variable.shape.as_list()):
            variable_initializers.replace_initial_value(variable, source.value(old))
            loaded.append(name if old == name else f"{name} <- {old}")
        else:
            left.append(name)
    logger.info("Warm start from %s (a fresh run): %d variable(s) loaded%s; %d left at "
                "their initializer%s; optimizer slots, the global step and towerlib's "
                "state are not warm-started.", start.source, len(loaded), _listed(loaded),
                len(left), _listed(left))
    return loaded, left


def _listed(names, most=20):
    if not names:
        return ""
    more = f", ... {len(names) - most} more" if len(names) > most else ""
    return " (" + ", ".join(names[:most]) + more + ")"

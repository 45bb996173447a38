"""The same starting weights for every configuration, by variable name.

Op-level random seeds depend on the order a graph is built in, which differs
between towerlib, the hand-written loop and MirroredStrategy; so the initial
values are drawn once (one tower, one graph, a fixed seed), saved to an .npz
keyed by variable name, and every configuration loads them by name. A model
variable without a saved value is an error: it would mean the configurations
do not build the same architecture.
"""

import json

import numpy as np
import tensorflow as tf

import towerlib
from bench import inputs as inputs_lib
from bench.models import tower_loss

TRAINABLE_KEY = "__trainable_names__"


def is_model_variable(variable):
    """True for the model's own variables (not the step counter, not optimizer slots)."""
    name = variable.op.name if hasattr(variable, "op") else variable.name
    return "global_step" not in name and not name.endswith(("/Momentum", "/Momentum:0"))


def draw_initial_weights(model, path, seed):
    """Builds `model` once on one device, initializes it and saves its weights to `path`.

    Returns:
      {'num_variables': int, 'num_weights': int, 'checksum': float}.
    """
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(seed)
        images, labels = inputs_lib.synthetic_batch(2, seed)
        ctx = towerlib.TowerContext.single(is_training=True)
        tower_loss(model.tower_fn((tf.constant(images), tf.constant(labels)), ctx))
        variables = [v for v in tf.compat.v1.global_variables() if is_model_variable(v)]
        trainable = {v.op.name for v in tf.compat.v1.trainable_variables()}
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            values = {v.op.name: session.run(v) for v in variables}
    order = sorted(values)
    np.savez(path, **values, **{TRAINABLE_KEY: np.array(
        json.dumps([name for name in order if name in trainable]))})
    return {"num_variables": len(values),
            "num_weights": int(sum(v.size for v in values.values())),
            "checksum": checksum(values)}


def read_weights(path):
    """(values {name: array}, trainable names [str]) from a file `draw_initial_weights` wrote."""
    with np.load(path) as archive:
        values = {name: archive[name] for name in archive.files if name != TRAINABLE_KEY}
        trainable = json.loads(str(archive[TRAINABLE_KEY]))
    return values, trainable


def checksum(values):
    """Sum of |w| over every array, in float64: equal weights give equal checksums."""
    return float(sum(np.abs(np.asarray(v, np.float64)).sum() for v in values.values()))


def load_into_session(session, variables, values):
    """Assigns `values` to the model variables among `variables`, by name.

    Raises:
      ValueError: a model variable has no saved value, or a shape differs.
    """
    loaded = {}
    for variable in variables:
        if not is_model_variable(variable):
            continue
        name = variable.op.name
        if name not in values:
            raise ValueError(
                f"Variable {name} has no initial value in the weights file: this "
                "configuration built a different architecture from the reference.")
        if tuple(variable.shape.as_list()) != values[name].shape:
            raise ValueError(f"Variable {name} has shape {variable.shape}, the weights file "
                             f"{values[name].shape}.")
        variable.load(values[name], session)
        loaded[name] = values[name]
    missing = sorted(set(values) - set(loaded))
    if missing:
        raise ValueError(f"The graph has no variables {missing} of the reference model.")
    return checksum(loaded)


def session_values(session, variables):
    """{name: value} of the model variables among `variables`."""
    model_variables = [v for v in variables if is_model_variable(v)]
    return dict(zip([v.op.name for v in model_variables], session.run(model_variables)))

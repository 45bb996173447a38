"""The values a tf_keras model holds in graph mode, which live in Keras' own session.

In a graph, tf_keras' `load_weights`, `set_weights` (and `weights=` of
tf_keras.applications, which calls load_weights) assign the values in
tf_keras' session (`tf_keras.backend.get_session()`), never in the session
that later trains the graph. What towerlib relies on:

- `_keras_initialized`, the private flag tf_keras' backend sets on each
  variable it has initialized (or assigned) in its session;
- `tf_keras.backend.batch_get_value`, which reads them from that session;
- tf_keras' graph-mode backend uses the default session when there is one
  (`construction_session` opens one while towerlib constructs a model:
  Keras' own would be a local session that cannot place a cluster's devices);
- `tf_keras.src.backend.batch_set_value(tuples)`, through which a .h5
  `load_weights` and `set_weights` assign: while towerlib constructs a
  model, it records the values instead (`assignments_captured`), with no
  session at all (a cluster's devices are not this process's);
- `tf_keras.src.engine.{training,training_v1}.Model.load_weights` and
  `tf_keras.src.engine.{base_layer,base_layer_v1}.Layer.set_weights` (the v1
  twins are the graph-mode classes), the entry points of held values,
  replaced by no-ops while a replicated
  tower's copy of the model is constructed (`weight_loading_skipped`).

tests/internals/test_internals_keras_sessions.py fails if tf_keras changes them.
"""

import contextlib
import threading

import numpy as np
import tensorflow as tf

from towerlib.internals import tf_keras

__all__ = ["assignments_captured", "construction_session", "held_values", "holds_values", "weight_loading_skipped"]

_lock = threading.Lock()


def holds_values(variables):
    """Whether tf_keras' session has initialized or assigned any of `variables`."""
    return any(getattr(v, "_keras_initialized", False) for v in variables)


def held_values(variables):
    """The numpy values tf_keras' session holds for `variables` (in the current graph).

    Raises tf.errors.FailedPreconditionError when that session lost them (its
    graph was replaced by another one's since).
    """
    return tf_keras.loaded().backend.batch_get_value(list(variables))


@contextlib.contextmanager
def assignments_captured():
    """While open, tf_keras' batch_set_value records {variable name: numpy value} in the
    dict yielded instead of assigning in a session."""
    import importlib
    backend = importlib.import_module("tf_keras.src.backend")
    assigned = {}

    def record(tuples):
        for variable, value in tuples:
            dtype = variable.dtype.base_dtype.as_numpy_dtype
            assigned[variable.op.name] = np.asarray(value, dtype=dtype)

    with _lock:
        saved = backend.batch_set_value
        backend.batch_set_value = record
        try:
            yield assigned
        finally:
            backend.batch_set_value = saved


@contextlib.contextmanager
def construction_session(graph):
    """While open, tf_keras assigns and reads held values in a session of this process
    on `graph` (soft placement: a tower's or a ps task's device may not be local)."""
    config = tf.compat.v1.ConfigProto(allow_soft_placement=True)
    with tf.compat.v1.Session(graph=graph, config=config) as session, session.as_default():
        yield session


@contextlib.contextmanager
def weight_loading_skipped():
    """While open, tf_keras' load_weights and set_weights do nothing.

    A replicated tower's copy of the model takes tower 0's values from its
    initializer; a model function called again for it loads nothing. Both
    tf_keras' layer and model classes have a graph-mode (v1) twin.
    """
    import importlib
    owners = [(importlib.import_module(f"tf_keras.src.engine.{module}"), cls, method)
              for module, cls, method in _LOADERS]
    with _lock:
        saved = [(getattr(m, c), name, getattr(m, c).__dict__[name]) for m, c, name in owners]
        for cls, name, _ in saved:
            setattr(cls, name, lambda self, *args, **kwargs: None)
        try:
            yield
        finally:
            for cls, name, method in saved:
                setattr(cls, name, method)


_LOADERS = [("base_layer", "Layer", "set_weights"), ("base_layer_v1", "Layer", "set_weights"),
            ("training", "Model", "load_weights"), ("training_v1", "Model", "load_weights")]

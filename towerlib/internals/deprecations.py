"""Silencing TensorFlow's deprecation warnings for calls towerlib makes on purpose.

Relies on ``tensorflow.python.util.deprecation.silence()``, a context manager
not exported as public API in TF 2.21: inside it, functions marked deprecated
log nothing. towerlib calls a few such functions because the graph-mode
training it offers has no other way (`tf.data.experimental.
make_saveable_from_iterator` for the data position, `SyncReplicasOptimizer`
and its queue runner for parameter servers); the user did not call them and
cannot act on the warning. Only those calls are wrapped.
"""

import contextlib

from tensorflow.python.util import deprecation as _tf_deprecation

__all__ = ["silenced"]


@contextlib.contextmanager
def silenced():
    """No deprecation warning from what runs inside."""
    with _tf_deprecation.silence():
        yield

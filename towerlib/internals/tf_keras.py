"""Everything towerlib takes from tf_keras (Keras 2), in one place, never imported eagerly.

towerlib runs without Keras. When a user's tower calls a `tf_keras` model,
towerlib needs these things from it, each used only here:

- `BatchNormalizationBase.call(self, inputs, training=None, mask=None)`:
  while a tower builds, calls of it are routed to towerlib's batch norm
  (`routed_batch_norm_calls`). Both `tf_keras.layers.BatchNormalization`
  and its SyncBatchNormalization inherit `call` from that base.
- `tf_keras.backend.is_keras_tensor`: a functional model's construction call,
  which is left to tf_keras.
- `tf_keras.src.legacy_tf_layers`: where tf.compat.v1.layers' classes live;
  their batch norm is not routed (TF 1 code keeps TF 1's behaviour).
- `tf_keras.models.clone_model`: a tower's own copy of a functional or
  Sequential model (replicated variables).
- `tf_keras.src.backend.get_default_graph_uid_map()`: the per-graph
  counters behind unnamed layers' names, so that a model function called
  again for another tower names its layers as the first call did.
- The Keras 3 package (`keras`), only to recognize its objects and refuse them.

tests/internals/test_internals_tf_keras.py fails if a tf_keras release
moves or changes any of these.
"""

import contextlib
import sys
import threading

_KERAS2 = "tf_keras"
_BASE_MODULE = "tf_keras.src.layers.normalization.batch_normalization"
_LEGACY_TF_LAYERS = "tf_keras.src.legacy_tf_layers."

_lock = threading.Lock()
_installed = {"count": 0, "original": None}
_routes = threading.local()  # .stack: the dispatch functions of this thread's open towers


def loaded():
    """The tf_keras module if the process has imported it, else None (never imports it)."""
    return sys.modules.get(_KERAS2)


def batch_norm_base():
    """tf_keras' BatchNormalizationBase class, or None without tf_keras loaded."""
    if loaded() is None:
        return None
    module = sys.modules.get(_BASE_MODULE)
    if module is None:
        import importlib
        module = importlib.import_module(_BASE_MODULE)
    return module.BatchNormalizationBase


def is_keras2_model(value):
    """Whether `value` is a tf_keras Model (Sequential, functional or subclassed)."""
    keras = loaded()
    return keras is not None and isinstance(value, keras.Model)


def keras3_kind(value):
    """'model', 'layer' or 'optimizer' for an object of Keras 3 (`keras`), else None."""
    module = type(value).__module__ or ""
    if not (module == "keras" or module.startswith("keras.")):
        return None
    keras = sys.modules.get("keras")
    for kind in ("Model", "Layer", "Optimizer"):
        cls = getattr(keras, kind, None) if keras is not None else None
        if cls is not None and isinstance(value, cls):
            return kind.lower()
    return "object"


def clone_model(model):
    """A new model of `model`'s structure and layer names, with new weights."""
    return loaded().models.clone_model(model)


def name_counters():
    """A copy of tf_keras' per-graph counters that number unnamed layers ('dense_1')."""
    from tf_keras.src import backend
    return dict(backend.get_default_graph_uid_map())


def restore_name_counters(counters):
    """Layers made next are named as they were after `counters` was taken."""
    from tf_keras.src import backend
    current = backend.get_default_graph_uid_map()
    current.clear()
    current.update(counters)


def is_symbolic(inputs):
    """Whether `inputs` is a Keras symbolic tensor: a functional model being constructed
    on its Input (no step runs it), which tf_keras' own call builds."""
    try:
        return bool(loaded().backend.is_keras_tensor(inputs))
    except (AttributeError, ValueError, TypeError):
        return False


def is_tf1_layer(layer):
    """Whether `layer` is a tf.compat.v1.layers one (tf_keras' legacy_tf_layers).

    Those keep TF 1's behaviour (updates in UPDATE_OPS; refused under
    'all_towers' and 'sync'; towerlib.layers.for_tower(ctx) is their swap).
    """
    return type(layer).__module__.startswith(_LEGACY_TF_LAYERS)


def is_learning_phase(value):
    """Whether `value` is tf_keras' graph-mode learning-phase placeholder."""
    op = getattr(value, "op", None)
    return op is not None and op.type == "PlaceholderWithDefault" and (
        op.name.rsplit("/", 1)[-1].startswith("keras_learning_phase"))


@contextlib.contextmanager
def routed_batch_norm_calls(dispatch):
    """While open, this thread's tf_keras batch-norm calls go to `dispatch`.

    `dispatch(layer, inputs, training)` returns the layer's output; a None
    dispatch keeps tf_keras' own call (a model constructed inside a tower), as
    do Keras symbolic inputs and tf.compat.v1.layers' batch norm. Other
    threads keep tf_keras' own `call`, and so does this one after exit. The
    class attribute is swapped while any thread has a route open (counted),
    and restored when the last closes. A no-op without tf_keras loaded.
    """
    base = batch_norm_base()
    if base is None:
        yield
        return
    _install(base)
    stack = getattr(_routes, "stack", None)
    if stack is None:
        stack = _routes.stack = []
    stack.append(dispatch)
    try:
        yield
    finally:
        stack.pop()
        _uninstall(base)


def _install(base):
    with _lock:
        if _installed["count"] == 0:
            original = base.__dict__["call"]
            _installed["original"] = original

            def call(self, inputs, training=None, mask=None):
                stack = getattr(_routes, "stack", None)
                if stack and stack[-1] is not None and not is_tf1_layer(self):
                    if is_symbolic(inputs):  # construction: shapes only, no update
                        return original(self, inputs, training=False, mask=mask)
                    return stack[-1](self, inputs, training)
                return original(self, inputs, training=training, mask=mask)

            call.__wrapped__ = original
            base.call = call
        _installed["count"] += 1


def _uninstall(base):
    with _lock:
        _installed["count"] -= 1
        if _installed["count"] == 0:
            base.call = _installed["original"]
            _installed["original"] = None


def policy_name(layer):
    """The layer's mixed-precision policy name ('float32', 'mixed_bfloat16', 'int32'...)."""
    policy = getattr(layer, "dtype_policy", None)
    return getattr(policy, "name", None)


def compute_dtype_of(layer):
    """The dtype name the layer computes in ('bfloat16' under 'mixed_bfloat16'), or None."""
    return getattr(layer, "compute_dtype", None)


def global_policy_name():
    """The name of Keras' global mixed-precision policy ('float32', 'mixed_bfloat16'),
    or None while tf_keras is not imported (then no one can have set one)."""
    keras = loaded()
    return None if keras is None else keras.mixed_precision.global_policy().name


@contextlib.contextmanager
def global_policy(name):
    """Layers constructed while open take Keras' mixed-precision policy `name`.

    tf_keras.mixed_precision.set_global_policy is process-wide: the previous
    policy is put back on exit (construction is short and single-threaded).
    """
    mixed_precision = loaded().mixed_precision
    before = mixed_precision.global_policy()
    mixed_precision.set_global_policy(name)
    try:
        yield
    finally:
        mixed_precision.set_global_policy(before)


def loss_function(identifier):
    """A loss given by name ('mse', 'sparse_categorical_crossentropy'), as compile reads it."""
    return loaded().losses.get(identifier)

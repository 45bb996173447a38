"""A Keras model's weights as towerlib's variables: routed, copied per tower, frozen.

Keras shares weights by calling the same layer object and ignores variable
scopes. While a KerasTower builds or calls its model, every variable Keras
makes goes through `tf.compat.v1.get_variable` under its Keras name (no
tower prefix) and the tower's variable scope's getter (`variables_through`),
so replicated towers get their copies and checkpoints hold the plain names.
A mixed-precision policy hands out AutoCastVariable wrappers; `stored` finds
the graph's variables behind them. A frozen layer's weights leave the
TRAINABLE_VARIABLES collection (`leave_frozen_weights_untrained`).

Values the model holds when the step is built (`weights=` a file or a hub
name, `load_weights`, `set_weights`: in a graph tf_keras assigns them in its
own session, which never trains) become the variables' initial values
(`keep_held_values`): the step-0 values under every update, and the chief's
values that the broadcast across workers carries.
"""

import contextlib

import tensorflow as tf

from towerlib.internals import keras_sessions, variable_initializers

__all__ = ["KerasTowerError", "keep_held_values", "leave_frozen_weights_untrained",
           "register_existing",
           "same_trainable_flags", "stored", "tower_has_copies", "variables_through"]


class KerasTowerError(TypeError):
    """A Keras model in a setting KerasTower cannot train it in."""


def leave_frozen_weights_untrained(model, graph):
    """Keras' frozen weights out of TRAINABLE_VARIABLES, so no step trains them.

    tf_keras leaves a `trainable = False` layer's variables in the collection
    (only `model.trainable_weights` drops them), and the collection is
    towerlib's default var_list. Every graph from this one to the root.
    """
    trainable = {w.op.name for w in model.trainable_weights}
    frozen = {w.op.name for w in model.weights} - trainable
    key = tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES
    while graph is not None and frozen:
        kept = graph.get_collection_ref(key)
        kept[:] = [v for v in kept if getattr(v, "op", None) is None
                   or v.op.name not in frozen]
        graph = getattr(graph, "outer_graph", None)


def same_trainable_flags(main, copy):
    """A replicated tower's clone freezes what the model freezes (layer by layer name)."""
    flags = {path: layer.trainable for path, layer in _layers_by_path(main)}
    for path, layer in _layers_by_path(copy):
        if path in flags and layer.trainable != flags[path]:
            layer.trainable = flags[path]


def _layers_by_path(model, prefix=""):
    for layer in getattr(model, "layers", []):
        path = f"{prefix}{layer.name}"
        yield path, layer
        yield from _layers_by_path(layer, path + "/")


def keep_held_values(model, assigned=None):
    """The values tf_keras holds for the model's weights become their initial values.

    `assigned`: {name: value} recorded while towerlib constructed the model
    (keras_sessions.assignments_captured); the rest is read from tf_keras'
    session where it initialized or restored them. Done when the model is
    first built or used in a graph, before any initializer op exists: the
    init op (and the replicated copies, read from tower 0's variables) then
    start from them; a restored checkpoint still wins. Nothing changes when
    nothing was loaded.
    """
    if not getattr(model, "built", False):  # no weights yet (a Sequential with no input shape)
        return
    assigned = assigned or {}
    weights = {w.op.name: w for w in model.weights}
    variables = {v.op.name: v for v in stored(list(weights.values()))}
    in_session = [v for name, v in variables.items() if name not in assigned
                  and keras_sessions.holds_values([v, weights.get(name, v)])]
    values = {name: assigned[name] for name in variables if name in assigned}
    if in_session:
        try:
            with in_session[0].graph.as_default():
                read = keras_sessions.held_values(in_session)
        except tf.errors.OpError as error:
            raise KerasTowerError(
                f"KerasTower: the model {model.name!r} holds values (a TF-format "
                "load_weights, or set in a session) that tf_keras cannot read back here "
                f"({type(error).__name__}). Fix: a .h5 weights file, or "
                "run_training(..., warm_start_from=<checkpoint or weights file>).") from None
        values.update({v.op.name: value for v, value in zip(in_session, read)})
    for name, value in values.items():
        variable_initializers.replace_initial_value(variables[name], value)


class _CopyAsked(Exception):
    pass


def tower_has_copies(main, getter):
    """Whether this tower's variable scope gives it its own copies (replicated)."""
    if getter is None or not main.weights:
        return False
    weight = stored(main.weights[:1])[0]

    def base(name, *args, **kwargs):
        if name == weight.op.name:
            return weight
        raise _CopyAsked(name)  # the getter would make a copy: nothing is made

    try:
        return getter(base, weight.op.name) is not weight
    except _CopyAsked:
        return True


def stored(weights):
    """The graph's variables behind `weights` (a mixed-precision policy hands out
    AutoCastVariable wrappers; the getters and copies know the variables)."""
    graph_variables = {v.op.name: v for v in tf.compat.v1.global_variables()}
    return [graph_variables.get(w.op.name, w) for w in weights]


def register_existing(model, getter):
    """Hands tower 0's existing weights to the scope's getter (replicated copies index them)."""
    if getter is None:
        return
    for weight in stored(model.weights):
        _a_variable(getter(lambda *a, _weight=weight, **k: _weight, weight.op.name),
                    weight.op.name)


def _a_variable(value, name):
    """The scope's getter must hand Keras a variable (a custom getter of yours may not)."""
    if not isinstance(value, tf.Variable):
        raise KerasTowerError(
            f"KerasTower: the tower's variable scope gives {name!r} as a "
            f"{type(value).__name__}, not a variable (a custom getter that casts or "
            "computes); Keras layers need variables. Fix: a custom getter that returns "
            "the variable; for half precision, the build's precision= (Keras' policy "
            "then casts the weights).")
    return value


@contextlib.contextmanager
def variables_through(getter, originals, tower_scope):
    """Keras' new variables made by get_variable under their Keras names, through `getter`.

    `originals` maps a plain name to a variable that exists already (tower
    0's, when a clone is built for tower i); the scope's getter then
    returns tower i's copy of it.
    """
    graph = tf.compat.v1.get_default_graph()
    creating = []  # non-empty while get_variable below creates through the creator
    variable_scope = tf.compat.v1.get_variable_scope()

    def create(name, *args, **kwargs):
        if name in originals:
            return originals[name]
        creating.append(name)
        try:
            root = tf.compat.v1.VariableScope(reuse=kwargs.pop("reuse", None), name="")
            with tf.compat.v1.variable_scope(root, auxiliary_name_scope=False):
                return tf.compat.v1.get_variable(name, *args, **kwargs)
        finally:
            creating.pop()

    def creator(next_creator, **kwargs):
        if creating:
            return next_creator(**kwargs)
        scope = graph.get_name_scope()
        if tower_scope and (scope + "/").startswith(tower_scope):
            scope = scope[len(tower_scope):]
        parts = [variable_scope.name, scope, kwargs["name"]]
        name = "/".join(p.strip("/") for p in parts if p and p.strip("/"))
        initial = kwargs["initial_value"]
        init = initial if callable(initial) else (lambda: initial)
        options = dict(shape=kwargs.get("shape"), dtype=kwargs.get("dtype"),
                       initializer=lambda *a, **k: init(),
                       trainable=kwargs.get("trainable"),
                       constraint=kwargs.get("constraint"), use_resource=True)
        if kwargs.get("trainable") is None:
            options.pop("trainable")
        if getter is None:
            return create(name, **options)
        return _a_variable(getter(create, name, **options), name)

    with tf.variable_creator_scope(creator):
        yield

"""A tf_keras model as the tower function, under every update and bn_mode.

    model = tf_keras.applications.MobileNetV2(weights=None, input_shape=(32, 32, 3), classes=10)
    tower = towerlib.KerasTower(model, tf_keras.losses.SparseCategoricalCrossentropy(
        from_logits=False))
    train = towerlib.build_train_graph(tower, (images, labels), optimizer, num_towers=4,
                                       update=towerlib.Replicated(), bn_mode="sync")

The inputs are (features, labels); each tower calls the model on its shard
with `training` set from the step (True in training towers, False in
evaluation towers) and returns {'loss': the mean of `loss(labels, outputs)`
over its examples, plus per-example metrics for build_eval_graph}.

The weights. Keras shares weights by calling the same layer object, and
ignores variable scopes, so towerlib routes the model's variable creation
through the tower's variable scope (`tf.compat.v1.get_variable` with the
Keras names, no tower prefix):

- parameter server: every tower calls the one model;
- replicated: tower 0 calls the model; tower i calls a clone
  (`tf_keras.models.clone_model`, same layer names) whose variables are
  tower i's copies of tower 0's (towerlib.update.copies), so checkpoints
  hold the plain Keras names either way and `model.save_weights` works.

A model object given already built (Sequential with input_shape, a
functional model) keeps its variables; a function that builds the model
(no arguments) is called once per graph, which an evaluation or export
graph needs. A subclassed model under `Replicated()` must be given as such
a function (clone_model cannot copy it).

The model's losses (`model.losses`): weight regularizers count once per
step (tower 0), activity regularizers per tower, weighted by its share.
Batch norm follows bn_mode: towerlib.batchnorm.keras_layers. Other layers'
`updates` go into UPDATE_OPS under the tower's scope, as TF 1 layers did.
"""

import contextlib
import re
import weakref

import tensorflow as tf

from towerlib.batchnorm import keras_layers
from towerlib.internals import error_texts, function_graphs, tf_keras
from towerlib.step import loss_terms
from towerlib.step.towers import TowerModel

__all__ = ["KerasTower"]


class KerasTower(TowerModel):
    """A tf_keras model and a loss, as a TowerModel.

    Args:
      model: a tf_keras.Model, or a function of no arguments returning one.
      loss: (labels, outputs) -> the loss, a scalar mean over the examples
        or one value per example ([n], averaged here); e.g. a
        tf_keras.losses.Loss object. None when only `outputs` is used, from
        a tower function of your own.
      metrics: None, or (labels, outputs) -> {name: [n] per-example tensor}
        for build_eval_graph. None gives 'correct' (top-1) when the outputs
        are [n, classes] scores and the labels [n] class ids.
    """

    def __init__(self, model, loss, metrics=None):
        _check_model(model)
        if loss is not None and not callable(loss):
            raise TypeError(f"KerasTower's loss must be a callable (labels, outputs) -> loss, "
                            f"got {type(loss).__name__}. Fix: e.g. tf_keras.losses."
                            "SparseCategoricalCrossentropy(from_logits=True).")
        self._given = model
        self._loss = loss
        self._metrics = metrics
        self._models = weakref.WeakKeyDictionary()  # root graph -> {tower index: model}
        self._name_counters = weakref.WeakKeyDictionary()  # root graph -> before 1st build

    def model(self, graph=None):
        """The model whose weights are the checkpoint's in `graph` (default: the current one).

        Built here, outside every tower, if the graph has none yet: an export
        or inference graph calls this, then the returned model.
        """
        graph = function_graphs.root_graph(graph or tf.compat.v1.get_default_graph())
        models = self._models.setdefault(graph, {})
        if 0 not in models:
            with graph.as_default():
                models[0] = self._main_model(graph, getter=None)
        return models[0]

    def build(self, inputs, ctx):
        """{'loss': the mean loss over the tower's examples, and the metrics}."""
        if self._loss is None:
            raise ValueError("This KerasTower was made without a loss; it gives the model's "
                             "outputs (KerasTower.outputs) to your own tower function. "
                             "Fix: KerasTower(model, loss) to use it as the tower function.")
        features, labels = _features_and_labels(inputs)
        outputs = self.outputs(features, ctx)
        loss = tf.convert_to_tensor(self._loss(labels, outputs))
        if loss.shape.rank != 0:
            loss = tf.reduce_mean(loss)
        metrics = (self._metrics or _default_metrics)(labels, outputs)
        return {"loss": loss, **metrics}

    def outputs(self, features, ctx):
        """The model's outputs on `features` in tower `ctx`, for a tower function of your own.

        The tower's model (tower 0's, or its replicated copy), `training` from
        ctx.is_training, the model's losses and updates registered as `build` does.
        """
        _check_float32(features)
        graph = tf.compat.v1.get_default_graph()
        try:
            return self._outputs(features, ctx, graph)
        except ValueError as error:
            if not (function_graphs.in_function_body(graph)
                    and error_texts.is_foreign_graph_element(error)):
                raise
            raise KerasTowerError(
                "KerasTower: the model holds a tensor of its construction (a symbolic "
                "add_loss or add_metric of a functional model), which the accumulation "
                "loop's body cannot use. Fix: accumulation_steps=1, or put that term in "
                "the loss function.") from error

    def _outputs(self, features, ctx, graph):
        getter = tf.compat.v1.get_variable_scope().custom_getter
        model, originals = self._tower_model(ctx, getter)
        if model is None:  # replicated: tower ctx.index's own copy, made here
            model = self._construct(self._copy, getter, originals)
            self._models[function_graphs.root_graph(graph)][ctx.index] = model
        _check_float32_policy(model)
        ops_before = len(graph.get_operations())
        with _variables_through(getter, originals, ctx.name_scope), \
                keras_layers.keras_batch_norm_in(ctx):
            outputs = model(features, training=ctx.is_training)
        _register_losses(model, ctx, graph.get_operations()[ops_before:])
        _register_updates(model, ctx)
        return outputs

    def _tower_model(self, ctx, getter):
        """(the model tower ctx.index calls, or None to copy; tower 0's weights by name)."""
        graph = function_graphs.root_graph(tf.compat.v1.get_default_graph())
        models = self._models.setdefault(graph, {})
        if 0 not in models:
            models[0] = self._main_model(graph, getter)
        main = models[0]
        if ctx.index == 0:
            _register_existing(main, getter)
            return main, {}
        originals = {v.op.name: v for v in main.weights}
        if ctx.index in models:
            return models[ctx.index], originals
        if not _tower_has_copies(main, getter):
            models[ctx.index] = main
            return main, originals
        if not (_is_clonable(main) or self._builder()):
            raise ValueError(
                f"KerasTower: with replicated variables each tower needs its own copy of "
                f"the model, and {type(main).__name__} is a subclassed model, which "
                "tf_keras.models.clone_model cannot copy. Fix: pass a function that builds "
                "it: KerasTower(lambda: MyModel(...), loss).")
        return None, originals

    def _builder(self):
        return None if tf_keras.is_keras2_model(self._given) else self._given

    def _main_model(self, graph, getter):
        if self._builder() is None:
            model = self._given
            if model.built and model.weights and (
                    function_graphs.root_graph(model.weights[0].graph) is not graph):
                raise ValueError(
                    f"KerasTower: the model {model.name!r} was built in another graph "
                    "than this build's. Fix: pass a function that builds the model "
                    "(KerasTower(lambda: make_model(), loss)), which is called once per graph.")
            return model
        model = self._construct(self._given, getter, {})
        _check_built_model(model)
        return model

    def _construct(self, make, getter, originals):
        """make(), outside every tower: a scope of its own, tf_keras' own batch norm,
        layers numbered as at the first construction, variables through `getter`."""
        graph = tf.compat.v1.get_default_graph()
        counters = self._name_counters.setdefault(function_graphs.root_graph(graph), tf_keras.name_counters())
        tf_keras.restore_name_counters(counters)
        with graph.name_scope(None), graph.name_scope("keras_model") as scope, \
                tf_keras.routed_batch_norm_calls(None), \
                _variables_through(getter, originals, scope):
            return make()

    def _copy(self):
        if self._builder() is not None:
            model = self._builder()()
            _check_built_model(model)
            return model
        main = self._models[function_graphs.root_graph(tf.compat.v1.get_default_graph())][0]
        return tf_keras.clone_model(main)


# A name inside a tower's name scope ('tower_1/...', 'outer/tower_1/...').
_IN_A_TOWER = re.compile(r"(^|/)tower_\d+/")


class KerasTowerError(TypeError):
    """A Keras model in a setting KerasTower cannot train it in."""


def _check_float32(features):
    """towerlib's half precisions cast tf.compat.v1 variables and inputs, not Keras layers."""
    dtype = getattr(features, "dtype", None)
    if dtype in (tf.float16, tf.bfloat16):
        raise KerasTowerError(
            f"KerasTower got {dtype.name} features: towerlib's precision=Float16()/"
            "BFloat16() casts get_variable weights and the inputs, which a Keras model does "
            "not use. Fix: precision=towerlib.Float32() with a Keras model.")


def _check_float32_policy(model):
    policies = {layer.compute_dtype for layer in [model] + list(model.submodules)
                if hasattr(layer, "compute_dtype") and hasattr(layer, "dtype_policy")}
    if policies - {"float32"}:
        raise KerasTowerError(
            f"KerasTower: the model {model.name!r} computes in {sorted(policies)} (a Keras "
            "mixed-precision policy); towerlib trains Keras models in float32 for now. "
            "Fix: tf_keras.mixed_precision.set_global_policy('float32') before building it.")


def _check_model(model):
    kind = tf_keras.keras3_kind(model)
    if kind is not None:
        raise TypeError(
            f"KerasTower got a Keras 3 {kind} ({type(model).__module__}."
            f"{type(model).__name__}); Keras 3 has no graph mode. Fix: build the model with "
            "tf_keras (pip install tf_keras; `import tf_keras`, and set "
            "TF_USE_LEGACY_KERAS=1 before importing TensorFlow if your code says tf.keras).")
    if tf_keras.is_keras2_model(model):
        return
    if callable(model) and not isinstance(model, tf.Module):
        return  # a function (or class) that builds the model
    raise TypeError(f"KerasTower's model must be a tf_keras.Model or a function that "
                    f"returns one, got {type(model).__name__}.")


def _check_built_model(model):
    if not tf_keras.is_keras2_model(model):
        kind = tf_keras.keras3_kind(model)
        what = f"a Keras 3 {kind}" if kind else type(model).__name__
        raise TypeError(f"KerasTower's model function returned {what}, not a tf_keras.Model. "
                        "Fix: build it with tf_keras (Keras 3 has no graph mode).")


def _is_clonable(model):
    keras = tf_keras.loaded()
    return isinstance(model, keras.Sequential) or getattr(model, "_is_graph_network", False)


def _features_and_labels(inputs):
    if isinstance(inputs, (tuple, list)) and len(inputs) == 2:
        return inputs[0], inputs[1]
    if isinstance(inputs, dict) and set(inputs) == {"features", "labels"}:
        return inputs["features"], inputs["labels"]
    raise ValueError(
        "KerasTower takes inputs (features, labels) (or a dict with exactly 'features' "
        f"and 'labels'); got {type(inputs).__name__}. Fix: pass the global batch as "
        "(images, labels).")


def _default_metrics(labels, outputs):
    if (isinstance(outputs, tf.Tensor) and outputs.shape.rank == 2
            and isinstance(labels, tf.Tensor) and labels.shape.rank == 1
            and labels.dtype.is_integer):
        correct = tf.math.in_top_k(tf.cast(labels, tf.int32), tf.cast(outputs, tf.float32), 1)
        return {"correct": tf.cast(correct, tf.int32)}
    return {}


class _CopyAsked(Exception):
    pass


def _tower_has_copies(main, getter):
    """Whether this tower's variable scope gives it its own copies (replicated)."""
    if getter is None or not main.weights:
        return False
    weight = main.weights[0]

    def base(name, *args, **kwargs):
        if name == weight.op.name:
            return weight
        raise _CopyAsked(name)  # the getter would make a copy: nothing is made

    try:
        return getter(base, weight.op.name) is not weight
    except _CopyAsked:
        return True


def _register_existing(model, getter):
    """Hands tower 0's existing weights to the scope's getter (replicated copies index them)."""
    if getter is None:
        return
    for weight in model.weights:
        _a_variable(getter(lambda *a, _weight=weight, **k: _weight, weight.op.name),
                    weight.op.name)


def _a_variable(value, name):
    """The scope's getter must hand Keras a variable (towerlib's casting getter does not)."""
    if not isinstance(value, tf.Variable):
        raise KerasTowerError(
            f"KerasTower: the tower's variable scope gives {name!r} as a "
            f"{type(value).__name__}, not a variable (a custom getter that casts, such as "
            "towerlib's Float16()/BFloat16() storage); Keras layers need variables. Fix: "
            "precision=towerlib.Float32() with a Keras model.")
    return value


@contextlib.contextmanager
def _variables_through(getter, originals, tower_scope):
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


def _register_losses(model, ctx, call_ops):
    """The model's losses into REGULARIZATION_LOSSES, each counted once per step.

    A term this call made (an activity regularizer, an add_loss of the
    outputs: its op is among `call_ops`) is the tower's own, weighted by its
    share. A term evaluated now from the weights alone (kernel_regularizer)
    counts once, from tower 0 of micro-batch 0, unless a term of the same
    variables is already counted (the model called twice, a shared layer).
    Anything else in model.losses (terms of a functional model's
    construction on its Input) belongs to no step and is left out.
    """
    if not ctx.is_training:
        return
    graph = tf.compat.v1.get_default_graph()
    made_by_call = {op.name for op in call_ops}
    ops_before = len(graph.get_operations())
    with graph.name_scope("keras_losses/"):
        losses = list(model.losses)
    evaluated_now = {op.name for op in graph.get_operations()[ops_before:]}
    key = tf.compat.v1.GraphKeys.REGULARIZATION_LOSSES
    counted = {loss_terms.variables_read(t) for t in tf.compat.v1.get_collection(key)
               if not _IN_A_TOWER.search(t.name)}  # the weights' terms already counted
    for term in losses:
        if term.op.name in made_by_call:
            tf.compat.v1.add_to_collection(key, tf.cast(term, tf.float32))
        elif term.op.name in evaluated_now and ctx.index == 0 and ctx.micro_batch == 0:
            signature = loss_terms.variables_read(term)
            if signature not in counted:
                counted.add(signature)
                with graph.name_scope("keras_losses/"):  # outside the towers: once
                    tf.compat.v1.add_to_collection(key, tf.cast(term, tf.float32))


def _register_updates(model, ctx):
    """Updates a layer made in this tower (not batch norm's: towerlib's) into UPDATE_OPS."""
    key = tf.compat.v1.GraphKeys.UPDATE_OPS
    present = {id(op) for op in tf.compat.v1.get_collection(key)}
    for update in model.updates:
        op = getattr(update, "op", update)
        if op.name.startswith(ctx.name_scope) and id(update) not in present:
            tf.compat.v1.add_to_collection(key, update)

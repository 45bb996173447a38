"""A tf_keras model as the tower function, under every update and bn_mode.

    model = tf_keras.applications.MobileNetV2(weights=None, input_shape=(32, 32, 3), classes=10)
    tower = towerlib.KerasTower(model, tf_keras.losses.SparseCategoricalCrossentropy(
        from_logits=False))
    train = towerlib.build_train_graph(tower, (images, labels), optimizer, num_towers=4,
                                       update=towerlib.Replicated(), bn_mode="sync")

The inputs are (features, labels), each a tensor, list or dict as the model
takes them; each tower calls the model on its shard with `training` set from
the step (True in training towers, False in evaluation towers) and returns
{'loss': the loss over its examples as compile forms it (per-output losses
and loss_weights: towerlib.keras.objective), plus per-example metrics
for build_eval_graph}.

The model trains as Keras trains it. The variables trained are the model's
`trainable_weights` when the step is built: a frozen layer's (`trainable =
False`, the base of a fine-tuning) leave the graph's TRAINABLE_VARIABLES
collection, so they get no update and no optimizer slot, and a frozen
batch norm runs in inference mode. Unfreezing takes effect in the next
build. The precision is the build's: under BFloat16() / Float16() the model
computes under Keras' 'mixed_bfloat16' / 'mixed_float16' policy (float32
variables; a function that builds the model is called under it), the one
way, so a model object of another policy is refused in one line.

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
from towerlib.internals import error_texts, function_graphs, keras_sessions, tf_keras
from towerlib.keras import export as keras_export
from towerlib.keras import model_checks
from towerlib.keras import weights as keras_weights
from towerlib.keras.objective import KerasObjective
from towerlib.keras.weights import KerasTowerError
from towerlib.precision import casting
from towerlib.step import loss_terms
from towerlib.step.towers import TowerModel

__all__ = ["KerasTower"]


class KerasTower(TowerModel):
    """A tf_keras model and a loss, as a TowerModel.

    Args:
      model: a tf_keras.Model, or a function of no arguments returning one.
      loss: (labels, outputs) -> the loss, a scalar mean over the examples
        or one value per example ([n], averaged here); e.g. a
        tf_keras.losses.Loss object. For several outputs, a list or dict
        per output, as model.compile takes it. None when only `outputs` is
        used, from a tower function of your own.
      metrics: None, or (labels, outputs) -> {name: [n] per-example tensor}
        for build_eval_graph, or a dict of such functions per output. None
        gives 'correct' (top-1) when the outputs are [n, classes] scores and
        the labels [n] class ids.
      loss_weights: None, or a list or dict per output, as model.compile.
    """

    def __init__(self, model, loss, metrics=None, loss_weights=None):
        model_checks.check_model(model)
        self._given = model
        self._objective = KerasObjective(loss, loss_weights, metrics)
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
                models[0] = self._main_model(graph, getter=None, policy=None)
        return models[0]

    def inference_model(self):
        """The model in the current graph, for inference or an export: model() where the
        model function builds it, else a clone of the model object's structure (its
        weights named as the checkpoint's). Restore the checkpoint into its weights."""
        graph = function_graphs.root_graph(tf.compat.v1.get_default_graph())
        given = self._given
        if self._builder() is not None or self._models.get(graph, {}).get(0) is not None \
                or not (given.built and given.weights) \
                or function_graphs.root_graph(given.weights[0].graph) is graph:
            model = self.model()
        elif model_checks.is_clonable(given):
            model = self._models.setdefault(graph, {})[0] = tf_keras.clone_model(given)
        else:
            raise KerasTowerError(
                f"KerasTower: the subclassed model {given.name!r} was built in another graph, "
                "and its structure cannot be copied into this one. Fix: give KerasTower a "
                "function that builds the model (KerasTower(lambda: MyModel(...), loss)).")
        if not model.weights:
            raise KerasTowerError(
                f"KerasTower: the model {model.name!r} has no weights until it is called (a "
                "subclassed model), so there is nothing to restore or export. Fix: build it "
                "in the model function (model.build(input_shape) or one call on an input) "
                "or use a functional or Sequential model.")
        return model

    def export_saved_model(self, checkpoint, export_dir):
        """The model with `checkpoint`'s weights as a SavedModel (towerlib.keras.export)."""
        return keras_export.export_saved_model(self, checkpoint, export_dir)

    def save_weights(self, checkpoint, path):
        """`checkpoint`'s weights as Keras' own weights file, for `load_weights`."""
        return keras_export.save_weights(self, checkpoint, path)

    def build(self, inputs, ctx):
        """{'loss': the mean loss over the tower's examples, and the metrics}."""
        if not self._objective.has_loss and ctx.is_training:
            raise ValueError("This KerasTower was made without a loss; it gives the model's "
                             "outputs (KerasTower.outputs) to your own tower function. "
                             "Fix: KerasTower(model, loss) to use it as the tower function.")
        features, labels = _features_and_labels(inputs)
        outputs = self.outputs(features, ctx)
        if ctx.is_training and ctx.index == 0:
            model_checks.check_something_trains(self._tower_main_model())
        names = list(getattr(self._tower_main_model(), "output_names", None) or [])
        metrics = self._objective.metrics(labels, outputs, names)
        if not self._objective.has_loss:  # an evaluation tower: metrics only
            return metrics
        return {"loss": self._objective.loss(labels, outputs, names), **metrics}

    def _tower_main_model(self):
        graph = function_graphs.root_graph(tf.compat.v1.get_default_graph())
        return self._models[graph][0]

    def outputs(self, features, ctx):
        """The model's outputs on `features` in tower `ctx`, for a tower function of your own.

        The tower's model (tower 0's, or its replicated copy), `training` from
        ctx.is_training, the model's losses and updates registered as `build`
        does, computing in ctx.compute_dtype (the build's precision).
        """
        graph = tf.compat.v1.get_default_graph()
        try:
            with casting.weights_read_as_stored():  # Keras' policy casts the weights
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
        policy = _policy_for(ctx)
        model, originals = self._tower_model(ctx, getter, policy)
        if model is None:  # replicated: tower ctx.index's own copy, made here
            main = self._models[function_graphs.root_graph(graph)][0]
            # Keras may run the copies' initializers while it builds (a functional
            # model's symbolic add_loss does), and they read tower 0's weights: in a
            # session of this graph where those are initialized, not in Keras' own.
            # On a cluster's devices (/job:...) no local session can run them: built as
            # it is there.
            root = function_graphs.root_graph(graph)
            if any("/job:" in v.device for v in originals.values()):
                model = self._construct(self._copy, getter, originals, policy)
            else:
                with keras_sessions.construction_session(root) as session:
                    session.run([v.initializer for v in originals.values()])
                    model = self._construct(self._copy, getter, originals, policy)
            keras_weights.same_trainable_flags(main, model)
            self._models[function_graphs.root_graph(graph)][ctx.index] = model
        if ctx.is_training:
            model_checks.check_policy(model, ctx.compute_dtype)
        ops_before = len(graph.get_operations())
        with keras_weights.variables_through(getter, originals, ctx.name_scope), \
                keras_layers.keras_batch_norm_in(ctx):
            outputs = model(features, training=ctx.is_training)
        if ctx.index == 0:
            keras_weights.leave_frozen_weights_untrained(model, graph)
        _register_losses(model, ctx, graph.get_operations()[ops_before:])
        _register_updates(model, ctx)
        return outputs

    def _tower_model(self, ctx, getter, policy):
        """(the model tower ctx.index calls, or None to copy; tower 0's weights by name)."""
        graph = function_graphs.root_graph(tf.compat.v1.get_default_graph())
        models = self._models.setdefault(graph, {})
        if 0 not in models:
            models[0] = self._main_model(graph, getter, policy)
        main = models[0]
        if ctx.index == 0:
            keras_weights.register_existing(main, getter)
            return main, {}
        originals = {v.op.name: v for v in keras_weights.stored(main.weights)}
        if ctx.index in models:
            return models[ctx.index], originals
        if not keras_weights.tower_has_copies(main, getter):
            models[ctx.index] = main
            return main, originals
        if not (model_checks.is_clonable(main) or self._builder()):
            raise ValueError(
                f"KerasTower: with replicated variables each tower needs its own copy of "
                f"the model, and {type(main).__name__} is a subclassed model, which "
                "tf_keras.models.clone_model cannot copy. Fix: pass a function that builds "
                "it: KerasTower(lambda: MyModel(...), loss).")
        return None, originals

    def _builder(self):
        return None if tf_keras.is_keras2_model(self._given) else self._given

    def _main_model(self, graph, getter, policy):
        if self._builder() is None:
            model = self._given
            if model.built and model.weights and (
                    function_graphs.root_graph(model.weights[0].graph) is not graph):
                raise ValueError(
                    f"KerasTower: the model {model.name!r} was built in another graph "
                    "than this build's. Fix: pass a function that builds the model "
                    "(KerasTower(lambda: make_model(), loss)), which is called once per graph.")
            keras_weights.keep_held_values(model)
            return model
        model_checks.check_global_policy(policy)
        with keras_sessions.construction_session(graph), \
                keras_sessions.assignments_captured() as assigned:  # what Keras loads
            model = self._construct(self._given, getter, {}, policy)
            model_checks.check_built_model(model)
            keras_weights.keep_held_values(model, assigned)
        return model

    def _construct(self, make, getter, originals, policy):
        """make(), outside every tower: a scope of its own, tf_keras' own batch norm,
        layers numbered as at the first construction, variables through `getter`,
        under Keras' mixed-precision `policy` (None: the global one). A replicated
        tower's copy (`originals` given) loads no weights: it starts from tower 0's."""
        graph = tf.compat.v1.get_default_graph()
        counters = self._name_counters.setdefault(function_graphs.root_graph(graph),
                                                  tf_keras.name_counters())
        tf_keras.restore_name_counters(counters)
        with graph.name_scope(None), graph.name_scope("keras_model") as scope, \
                tf_keras.routed_batch_norm_calls(None), \
                tf_keras.global_policy(policy) if policy else contextlib.nullcontext(), \
                casting.weights_read_as_stored(), \
                keras_weights.variables_through(getter, originals, scope), \
                keras_sessions.weight_loading_skipped() if originals \
                else contextlib.nullcontext():
            return make()

    def _copy(self):
        if self._builder() is not None:
            model = self._builder()()
            model_checks.check_built_model(model)
            return model
        main = self._models[function_graphs.root_graph(tf.compat.v1.get_default_graph())][0]
        return tf_keras.clone_model(main)


# A name inside a tower's name scope ('tower_1/...', 'outer/tower_1/...').
_IN_A_TOWER = re.compile(r"(^|/)tower_\d+/")


def _policy_for(ctx):
    """Keras' policy name for the tower's compute dtype; None in float32 (left as set)."""
    return model_checks.MIXED.get(ctx.compute_dtype) if ctx.is_training else None


def _features_and_labels(inputs):
    if isinstance(inputs, (tuple, list)) and len(inputs) == 2:
        return inputs[0], inputs[1]
    if isinstance(inputs, dict) and set(inputs) == {"features", "labels"}:
        return inputs["features"], inputs["labels"]
    raise ValueError(
        "KerasTower takes inputs (features, labels) (or a dict with exactly 'features' "
        f"and 'labels'); got {type(inputs).__name__}. Fix: pass the global batch as "
        "(images, labels).")


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

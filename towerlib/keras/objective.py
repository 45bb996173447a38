"""A Keras model's loss and metrics in one tower, formed as `model.compile` forms them.

    tower = towerlib.KerasTower(
        model,                            # outputs {'digit': [n, 10], 'size': [n, 1]}
        loss={"digit": tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              "size": "mse"},
        loss_weights={"digit": 1.0, "size": 0.5})
    # labels {'digit': [n] int32, 'size': [n, 1] float32}; the tower's loss is
    # 1.0 * mean digit loss + 0.5 * mean size loss over its examples.

`loss` is one callable (every output takes it and the terms are summed, as
compile does), a list in the model's output order, or a dict by output name
(an output left out, or given None, has no loss); a string is read as
compile reads it (`tf_keras.losses.get`). Each loss returns the mean over
the examples (a scalar) or one value per example ([n], averaged here); any
other shape is refused, since averaging it would weight the towers wrongly.
`loss_weights` (a list or a dict; 1 where not given) weights the terms.

Metrics for build_eval_graph: `metrics(labels, outputs) -> {name: [n]}` over
the whole structures, or a dict {output name: that function for one
output}, whose names are prefixed '<output>_'. None gives top-1 'correct'
for every output of [n, classes] scores with [n] integer labels
('<output>_correct' when the model has several outputs).
"""

import tensorflow as tf

from towerlib.internals import tf_keras

__all__ = ["KerasObjective"]


class KerasObjective:
    """The per-tower loss and metrics of a model's outputs; see the module docstring."""

    def __init__(self, loss, loss_weights=None, metrics=None):
        _check_loss(loss)
        _check_weights(loss_weights)
        if metrics is not None and not callable(metrics) and not isinstance(metrics, dict):
            raise TypeError(
                f"KerasTower's metrics must be a function (labels, outputs) -> {{name: [n] "
                f"tensor}} or a dict of such functions by output name, got "
                f"{type(metrics).__name__}.")
        self.has_loss = loss is not None
        self._loss, self._loss_weights, self._metrics = loss, loss_weights, metrics

    def loss(self, labels, outputs, output_names):
        """The weighted sum of the outputs' mean losses, a float32 scalar."""
        pairs = _paired(labels, outputs, output_names)
        losses = _per_output(self._loss, [name for name, _, _ in pairs], "loss")
        weights = _per_output(self._loss_weights, [name for name, _, _ in pairs],
                              "loss_weights", default=1.0)
        terms = []
        for (name, label, output), loss_fn, weight in zip(pairs, losses, weights):
            if loss_fn is None:
                continue
            if isinstance(loss_fn, str):
                loss_fn = tf_keras.loss_function(loss_fn)
            value = _mean_of(tf.convert_to_tensor(loss_fn(label, output)), name)
            terms.append(tf.cast(value, tf.float32) * float(weight))
        if not terms:
            raise ValueError("KerasTower: no output has a loss. Fix: give a loss for at "
                             f"least one of the outputs {[n for n, _, _ in pairs]}.")
        return tf.add_n(terms) if len(terms) > 1 else terms[0]

    def metrics(self, labels, outputs, output_names):
        """{name: [n] per-example tensor} for build_eval_graph."""
        if callable(self._metrics):
            return dict(self._metrics(labels, outputs))
        pairs = _paired(labels, outputs, output_names)
        several = len(pairs) > 1
        found = {}
        for name, label, output in pairs:
            if isinstance(self._metrics, dict):
                metric_fn = self._metrics.get(name)
                values = dict(metric_fn(label, output)) if metric_fn is not None else {}
                found.update({f"{name}_{key}": value for key, value in values.items()})
            elif _is_class_scores(label, output):
                found[f"{name}_correct" if several else "correct"] = _correct(label, output)
        return found


def _check_loss(loss):
    def valid(one):
        return one is None or callable(one) or isinstance(one, str)
    if isinstance(loss, dict):
        ok = all(valid(v) for v in loss.values())
    elif isinstance(loss, (list, tuple)):
        ok = all(valid(v) for v in loss)
    else:
        ok = valid(loss)
    if not ok:
        raise TypeError(
            f"KerasTower's loss must be a callable (labels, outputs) -> loss, a loss name, "
            f"or a list or dict of them per output, got {loss!r}. Fix: e.g. tf_keras.losses."
            "SparseCategoricalCrossentropy(from_logits=True).")


def _check_weights(loss_weights):
    values = (list(loss_weights.values()) if isinstance(loss_weights, dict)
              else list(loss_weights) if isinstance(loss_weights, (list, tuple))
              else None if loss_weights is None else [loss_weights])
    if values is None:
        return
    if isinstance(loss_weights, (int, float)) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and v == v
            and abs(v) != float("inf") for v in values):
        raise TypeError(
            f"KerasTower's loss_weights must be a list (the model's output order) or a dict "
            f"by output name of finite numbers, got {loss_weights!r}.")


def _paired(labels, outputs, names):
    """[(output name, its labels, the output)] in the model's output order."""
    if isinstance(outputs, dict):
        names = list(outputs)
        outputs = [outputs[n] for n in names]
    elif isinstance(outputs, (list, tuple)):
        outputs = list(outputs)
        names = list(names) if names and len(names) == len(outputs) else [
            f"output_{i}" for i in range(len(outputs))]
    else:
        return [((names or ["output"])[0], labels, outputs)]
    if isinstance(labels, dict):
        missing = [n for n in names if n not in labels]
        if missing:
            raise ValueError(
                f"KerasTower: the labels have no entry for the model's outputs {missing} "
                f"(labels: {sorted(labels)}). Fix: labels as a dict with a key per output "
                f"name {names}, or a list in that order.")
        labels = [labels[n] for n in names]
    elif not isinstance(labels, (list, tuple)) or len(labels) != len(outputs):
        raise ValueError(
            f"KerasTower: the model has {len(outputs)} outputs {names}, so the labels must "
            "be a list in that order or a dict by output name; got "
            f"{type(labels).__name__}.")
    return list(zip(names, labels, outputs))


def _per_output(given, names, what, default=None):
    """`given` (one value, a list or a dict) as one entry per output name."""
    if isinstance(given, dict):
        unknown = sorted(set(given) - set(names))
        if unknown:
            raise ValueError(f"KerasTower: {what} names {unknown}, which are not outputs of "
                             f"the model {names}. Fix: key {what} by output name.")
        return [given.get(n, default if what == "loss_weights" else None) for n in names]
    if isinstance(given, (list, tuple)):
        if len(given) != len(names):
            raise ValueError(f"KerasTower: {what} has {len(given)} entries for the model's "
                             f"{len(names)} outputs {names}. Fix: one per output, in order.")
        return list(given)
    return [default if given is None else given] * len(names)


def _mean_of(value, name):
    """A scalar loss as it is; one value per example averaged; anything else refused."""
    rank = value.shape.rank
    if rank == 0:
        return value
    if rank == 1 or rank is None:
        return tf.reduce_mean(value)
    raise ValueError(
        f"KerasTower: the loss for output {name!r} returned shape {value.shape}; it must be "
        "a scalar mean or one value per example [n]. Fix: reduce it per example (e.g. "
        "tf.reduce_mean(loss, axis=-1)), or use a tf_keras.losses object, which averages.")


def _is_class_scores(labels, outputs):
    return (isinstance(outputs, tf.Tensor) and outputs.shape.rank == 2
            and isinstance(labels, tf.Tensor) and labels.shape.rank == 1
            and labels.dtype.is_integer)


def _correct(labels, outputs):
    correct = tf.math.in_top_k(tf.cast(labels, tf.int32), tf.cast(outputs, tf.float32), 1)
    return tf.cast(correct, tf.int32)

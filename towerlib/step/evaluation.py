"""Evaluation on every tower, combined exactly over uneven shards.

    evaluation = towerlib.build_eval_graph(metric_fn, (images, labels), num_towers=4)
    session.run(evaluation.reset_op)
    for _ in range(num_batches):
        session.run(evaluation.update_op)
    precision = session.run(evaluation.values["correct"])

`metric_fn(inputs, ctx)` is built once per tower, in inference mode
(`ctx.is_training` is False: batch norm uses its moving statistics, dropout
is off), and returns a dict of per-example tensors, each [n_i] for the
tower's n_i examples: 1/0 for a correct top-1 prediction, a per-example
loss, and so on. Each run of `update_op` adds every tower's sums and its
example count into local variables on the host CPU, integer metrics in
int64 and floating ones in float64, so `values[name] = total / examples` is
the exact mean over every example seen whatever the split: with 10 examples
on 3 towers (4 + 3 + 3), 7 correct give 0.7, as on one device.

The variables are the training graph's when built next to it
(`reuse_variables=True`), or made here to be restored from a checkpoint
(a Saver, or `towerlib.ema_restore_map` for EMA weights).
"""

import dataclasses
from typing import Dict, List, Tuple

import tensorflow as tf

from towerlib.step import devices as devices_lib
from towerlib.step import towers as towers_lib

__all__ = ["EvalGraph", "build_eval_graph"]


@dataclasses.dataclass
class EvalGraph:
    """The evaluation's ops and tensors.

    Attributes:
      update_op: adds one global batch's sums; run once per batch.
      reset_op: zeroes the totals (the totals are local variables: also
        initialized by tf.compat.v1.local_variables_initializer()).
      totals: {metric: sum over every example seen} (int64 or float64).
      examples: int64 scalar, the examples seen.
      values: {metric: total / examples}, float64.
      devices: the tower device strings.
      inputs: the global batch's tensors, flattened, when `inputs` was a
        nest of feedable tensors; () for an input_fn. Fetch them in one run
        and feed them to update_op in the next, and the end of the input
        ends a one-device run: nothing is cancelled across the towers'
        devices (towerlib.Evaluation does; TensorFlow logs each item a
        multi-device run abandons, several per evaluation).
    """

    update_op: tf.Operation
    reset_op: tf.Operation
    totals: Dict[str, tf.Tensor]
    examples: tf.Tensor
    values: Dict[str, tf.Tensor]
    devices: List[str]
    inputs: Tuple[tf.Tensor, ...] = ()


def _per_example(outputs, tower_index, batch_size):
    """The metric_fn's dict, each value checked to be a [n] vector of numbers.

    With n known statically (`batch_size`, a scalar tensor, constant when the
    split is static) a length other than the tower's example count is refused:
    the totals count examples from the first metric's length.
    """
    if not isinstance(outputs, dict) or not outputs:
        raise TypeError(
            f"metric_fn must return a non-empty dict of per-example tensors, tower "
            f"{tower_index} returned {type(outputs).__name__}.")
    for name, tensor in outputs.items():
        if not isinstance(tensor, tf.Tensor) or tensor.shape.rank != 1:
            raise ValueError(
                f"metric_fn's {name!r} must be a [examples] tensor (one value per "
                f"example of the tower), got {tensor!r}. Return e.g. "
                "tf.cast(tf.equal(predictions, labels), tf.int32), not its mean: a "
                "mean cannot be combined exactly over towers of different sizes.")
        if not (tensor.dtype.is_integer or tensor.dtype.is_floating or tensor.dtype.is_bool):
            raise TypeError(f"metric_fn's {name!r} has dtype {tensor.dtype.name}; "
                            "give numbers or booleans.")
        examples = tf.get_static_value(batch_size)
        if examples is not None and tensor.shape[0] not in (None, int(examples)):
            raise ValueError(
                f"metric_fn's {name!r} has {tensor.shape[0]} values but tower "
                f"{tower_index} has {int(examples)} examples: give one value per "
                "example.")
    return outputs


def _returning_a_dict(metric_fn):
    """metric_fn, refusing at build time any result that is not a dict of metrics."""
    def checked(inputs, ctx):
        result = metric_fn(inputs, ctx)
        if not isinstance(result, dict):
            what = "a tf.Tensor" if isinstance(result, tf.Tensor) else type(result).__name__
            raise TypeError(
                f"metric_fn must return a dict of per-example tensors, {{name: [n] "
                f"tensor}}; tower {ctx.index} returned {what}. Fix: return e.g. "
                "{'correct': tf.cast(tf.equal(predictions, labels), tf.int32)}.")
        return result
    return checked


def _feedable_inputs(inputs):
    """The global batch's tensors, flattened, if every one can be fed; else ()."""
    if callable(inputs):
        return ()
    flat = tf.nest.flatten(inputs)
    if not flat or not all(isinstance(t, tf.Tensor) and t.graph.is_feedable(t)
                           and t.dtype not in (tf.resource, tf.variant) for t in flat):
        return ()
    return tuple(flat)


def _total_dtype(dtype):
    return tf.float64 if dtype.is_floating else tf.int64


def build_eval_graph(metric_fn, inputs, *, num_towers=None, devices=None,
                     device_type=None, reuse_variables=False, bn_mode="first_tower"):
    """Builds `metric_fn` on every tower and the exact totals over them.

    Args:
      metric_fn: (inputs, ctx) -> {name: [n_i] per-example tensor}; built in
        inference mode. A TowerModel's `build` works when it returns such a
        dict (a 'loss' entry, if any, is ignored).
      inputs: the global batch (split over the towers, uneven when it must)
        or an input function input_fn(ctx), as for build_train_graph.
      num_towers, devices, device_type: the towers, as for build_train_graph.
      reuse_variables: True next to a training graph in the same graph.
      bn_mode: accepted for symmetry; inference uses moving statistics.

    Returns:
      An EvalGraph.
    """
    towers, _ = towers_lib.build_towers(
        _returning_a_dict(towers_lib.as_tower_fn(metric_fn)), inputs, num_towers=num_towers, devices=devices,
        device_type=device_type, is_training=False, bn_mode=bn_mode,
        reuse_variables=reuse_variables, require_loss=False, check_isolation=False)
    tower_metrics = [_per_example(t.outputs, t.context.index, t.context.batch_size)
                     for t in towers]
    names = sorted(tower_metrics[0])
    for index, metrics in enumerate(tower_metrics):
        if sorted(metrics) != names:
            raise ValueError(f"Tower {index}'s metric_fn returned {sorted(metrics)}, "
                             f"tower 0's {names}: every tower must return the same.")
    used_devices = [t.context.device for t in towers]
    with tf.device(devices_lib.host_cpu(used_devices[0])), tf.name_scope("evaluation"):
        totals, updates = {}, []
        for name in names:
            dtype = _total_dtype(tower_metrics[0][name].dtype)
            total = tf.compat.v1.Variable(
                tf.zeros([], dtype), trainable=False, name=f"total_{name}",
                collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES])
            tower_sums = [tf.reduce_sum(tf.cast(metrics[name], dtype))
                          for metrics in tower_metrics]
            updates.append(total.assign_add(tf.add_n(tower_sums)))
            totals[name] = total
        examples = tf.compat.v1.Variable(
            tf.zeros([], tf.int64), trainable=False, name="examples",
            collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES])
        counts = [tf.size(metrics[names[0]], out_type=tf.int64) for metrics in tower_metrics]
        updates.append(examples.assign_add(tf.add_n(counts)))
        update_op = tf.group(*updates, name="update")
        reset_op = tf.group(*[v.assign(tf.zeros_like(v))
                              for v in list(totals.values()) + [examples]], name="reset")
        values = {name: tf.math.divide_no_nan(tf.cast(total.read_value(), tf.float64),
                                              tf.cast(examples.read_value(), tf.float64))
                  for name, total in totals.items()}
    return EvalGraph(update_op=update_op, reset_op=reset_op,
                     totals={k: v.read_value() for k, v in totals.items()},
                     examples=examples.read_value(), values=values, devices=used_devices,
                    inputs=_feedable_inputs(inputs))

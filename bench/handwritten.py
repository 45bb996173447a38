"""The classic hand-written multi-tower training step: the overhead baseline.

This is what TF 1 users wrote by hand before a library did it for them (the
pattern of the multi-GPU CIFAR-10 tutorial), written here from scratch and
without towerlib's tower machinery:

- every variable once on the parameter device (/cpu:0), via a device function
  that sends variable ops there and everything else to the tower's device;
- the global batch split evenly, one slice per tower;
- tower 0 creates the variables, `reuse_variables()` after it;
- each tower differentiates its own mean loss; the gradients are averaged
  per variable on the parameter device;
- tower 0's UPDATE_OPS (batch-norm moving averages) run under a control
  dependency of the single `apply_gradients`.

It uses the same model function as every other configuration, so what the
comparison with towerlib measures is the tower and gradient machinery alone.
It is deliberately lean (no summaries, no checks, no uneven batches): the
baseline must not be slowed down by anything towerlib would not also do.
"""

import tensorflow as tf

import towerlib
from bench.models import tower_loss

# The op types that hold a variable's storage.
_VARIABLE_OP_TYPES = ("VarHandleOp", "VariableV2", "Variable")


def _variables_on(param_device, tower_device):
    """Device function: variable storage on `param_device`, all else on the tower."""
    def place(op):
        return param_device if op.type in _VARIABLE_OP_TYPES else tower_device
    return place


def _average_gradients(tower_grads_and_vars):
    """One (mean gradient, variable) per variable over the towers' lists.

    Each tower lists the same variables in the same order (they share them).
    A variable without a gradient in tower 0 is left out, as it is in every tower.
    """
    averaged = []
    for per_tower in zip(*tower_grads_and_vars):
        variable = per_tower[0][1]
        grads = [grad for grad, _ in per_tower if grad is not None]
        if not grads:
            continue
        with tf.device(variable.device):
            mean = grads[0] if len(grads) == 1 else tf.add_n(grads) / float(len(grads))
        averaged.append((mean, variable))
    return averaged


def build_train_op(tower_fn, global_batch, optimizer, devices,
                   param_device="/device:CPU:0"):
    """Builds the classic multi-tower training step.

    Args:
      tower_fn: (inputs, ctx) -> loss (or a dict with 'loss'); the model.
      global_batch: (images, labels) tensors whose batch size is a multiple
        of len(devices).
      optimizer: a tf.compat.v1.train.Optimizer.
      devices: the tower devices, e.g. ['/device:CPU:0', '/device:CPU:1'].
      param_device: where the single copy of every variable lives.

    Returns:
      The train op: one optimizer step per global batch.
    """
    num_towers = len(devices)
    with tf.device(param_device):
        global_step = tf.compat.v1.train.get_or_create_global_step()
        shards = [tf.split(tensor, num_towers, axis=0) for tensor in global_batch]

    tower_grads_and_vars = []
    first_tower_update_ops = []
    with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope()):
        for index, device in enumerate(devices):
            with tf.compat.v1.device(_variables_on(param_device, device)), \
                    tf.name_scope(f"tower_{index}") as scope:
                # No TowerRecords: the model's batch norm puts its moving-average
                # updates into UPDATE_OPS, as plain TF 1 code expects.
                ctx = towerlib.TowerContext(
                    index=index, num_towers=num_towers, device=device, is_training=True,
                    bn_mode="first_tower", name_scope=scope)
                loss = tower_loss(tower_fn(tuple(s[index] for s in shards), ctx))
                tf.compat.v1.get_variable_scope().reuse_variables()
                if index == 0:
                    # Tower 0's shard is representative of the batch: its updates
                    # alone move the statistics, once per step.
                    first_tower_update_ops = tf.compat.v1.get_collection(
                        tf.compat.v1.GraphKeys.UPDATE_OPS, scope)
                    regularization = tf.compat.v1.losses.get_regularization_losses()
                    if regularization:
                        # The averaging below divides by N; the regularization,
                        # registered once when tower 0 created the variables, must
                        # count once.
                        loss += num_towers * tf.add_n(regularization)
                tower_grads_and_vars.append(optimizer.compute_gradients(
                    loss, colocate_gradients_with_ops=True))

    grads_and_vars = _average_gradients(tower_grads_and_vars)
    with tf.control_dependencies(first_tower_update_ops):
        return optimizer.apply_gradients(grads_and_vars, global_step=global_step)


def session_config(num_devices):
    """A ConfigProto with `num_devices` CPU devices (virtual ones without GPUs)."""
    config = tf.compat.v1.ConfigProto(allow_soft_placement=True)
    config.device_count["CPU"] = num_devices
    config.gpu_options.allow_growth = True
    return config

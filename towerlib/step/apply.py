"""The end of a training step: batch-norm updates, the one apply, the EMA.

    train_op, update_ops, ema = build_apply(
        optimizer, update, pairs, towers, records, bn_mode, global_step,
        ema_decay=0.999, var_list=var_list, loss_scale=None, losses=tower_losses)

The chosen batch-norm updates run under control dependencies of the apply
(which towers' UPDATE_OPS, and where, is the classic question), the weights'
moving average after it. With a loss scale
(precision='float16') all three sit inside the loss scale's
apply_or_skip: a step whose gradients overflow leaves the weights, the
slots, global_step, the moving statistics and the EMA as they were, and
only the scale changes (towerlib.precision.loss_scaling). Update ops the tower
function made itself already exist in the towers and run either way.
"""

import tensorflow as tf

from towerlib.batchnorm import normalization

__all__ = ["build_apply", "chosen_update_ops", "user_update_ops"]


def user_update_ops(towers, bn_mode):
    """The tower function's own UPDATE_OPS that run once per step.

    They cannot be pooled, so 'first_tower' runs tower 0's and the other
    modes every tower's; with gradient accumulation, those of the step's
    first micro-batch (towerlib.step.micro_loop runs them there).
    """
    return [op for tower in towers if bn_mode.runs_update_ops_of(tower.context)
            for op in tower.update_ops]


def chosen_update_ops(towers, records, bn_mode, shared=None):
    """towerlib batch-norm updates plus the user's own UPDATE_OPS, per mode."""
    return (normalization.moving_average_updates(records, bn_mode, shared)
            + user_update_ops(towers, bn_mode))


def build_apply(optimizer, update, pairs, towers, records, bn_mode, global_step, *,
                ema_decay, var_list, loss_scale, losses, shared_statistics=None,
                every_sum=None):
    """(train op, the update ops it waits for, the ExponentialMovingAverage or None).

    Args:
      optimizer, update: the optimizer and the variable update (towerlib.
        variable_update) whose `apply` makes the one apply op.
      pairs: the (gradient, variable) pairs to apply, unscaled.
      towers, records, bn_mode: for the batch-norm updates.
      ema_decay, var_list: the weights' moving average, if any.
      loss_scale: a towerlib.precision.loss_scaling.LossScale, or None.
      losses: the towers' losses (float32 scalars), so that a non-finite
        loss under loss scaling reaches the NaN guard instead of passing for
        an overflow.
      shared_statistics: across workers, {layer: per local tower (mean,
        variance)} every worker shares, exchanged outside float16's skip (it
        runs whether or not the step applies); None on one machine.
      every_sum: the step's summed gradients, each variable's once, on which the
        loss scale decides to skip (None: those of `pairs`). Sharded over workers,
        `pairs` are this worker's only, and every worker must decide alike.
    """
    built = {}
    shared = shared_statistics

    def step():
        built["update_ops"] = chosen_update_ops(towers, records, bn_mode, shared)
        with tf.control_dependencies(built["update_ops"]):
            apply_op = update.apply(optimizer, pairs, global_step)
        built["ema"] = None
        if ema_decay is None:
            return apply_op
        built["ema"] = tf.compat.v1.train.ExponentialMovingAverage(
            ema_decay, num_updates=global_step)
        with tf.control_dependencies([apply_op]):
            return tf.group(built["ema"].apply(var_list), name="train_op")

    if loss_scale is None:
        train_op = step()
    else:
        gradients = [g for g, _ in pairs] if every_sum is None else list(every_sum)
        losses_finite = tf.reduce_all(tf.stack([tf.math.is_finite(loss) for loss in losses]))
        train_op = loss_scale.apply_or_skip(
            loss_scale.all_finite(gradients), step, loss_is_finite=losses_finite)
    return train_op, built["update_ops"], built["ema"]

"""Aggregating per-tower gradients into one gradient per variable.

Each tower differentiates its loss already weighted by its share of the global
batch, so the aggregate is a plain sum, computed on the variable's own device,
or, when the variable lives on another task (a parameter server), first on the
towers' task: no gradient travels further than it has to. Dense gradients are added;
`IndexedSlices` (embedding lookups, gathers) are concatenated and stay sparse,
so a large embedding table never gets a dense gradient.
"""

import logging

import tensorflow as tf

logger = logging.getLogger("towerlib")


def _var_key(variable):
    """A key identifying a variable across towers (the same object in each)."""
    return id(variable)


def _sum_sparse(slices_list):
    return tf.IndexedSlices(
        values=tf.concat([s.values for s in slices_list], axis=0),
        indices=tf.concat([s.indices for s in slices_list], axis=0),
        dense_shape=slices_list[0].dense_shape)


def sum_gradients(gradients):
    """Sums one variable's gradients from several towers.

    Args:
      gradients: non-empty list of Tensors and/or IndexedSlices.

    Returns:
      A Tensor when every gradient is dense, IndexedSlices when every gradient
      is sparse; a mix is densified (it only happens when a variable is used
      both through a gather and directly).
    """
    if len(gradients) == 1:
        return gradients[0]
    if all(isinstance(g, tf.IndexedSlices) for g in gradients):
        return _sum_sparse(gradients)
    return tf.add_n([tf.convert_to_tensor(g) for g in gradients])


def _task(device):
    spec = tf.DeviceSpec.from_string(device or "")
    return (spec.job, spec.task) if spec.job else None


def _sum_near_the_towers(variable, gradients):
    """One variable's tower gradients summed where the fewest bytes travel.

    On the variable's device, unless the variable lives on another task than
    the towers (a parameter server): then the gradients on the towers' task
    are summed there first, so one sum per variable leaves the machine, not
    one per tower. A gradient already on the variable's task (tower 0's, when
    the weight decay term lives next to the variable) joins the sum there.
    """
    variable_task = _task(variable.device)
    local = [g for g in gradients
             if variable_task is not None and _task(g.device) not in (None, variable_task)]
    if not local:
        with tf.device(variable.device):
            return sum_gradients(gradients)
    with tf.device(local[0].device):
        partial = sum_gradients(local)
    remote = [g for g in gradients if not any(g is l for l in local)]
    if not remote:
        return partial
    with tf.device(variable.device):
        return sum_gradients([partial] + remote)


def aggregate_gradients(tower_grads_and_vars):
    """One (gradient, variable) pair per variable from every tower's list.

    Args:
      tower_grads_and_vars: a list (one entry per tower) of lists of
        (gradient, variable) pairs, as `Optimizer.compute_gradients` returns,
        every tower listing the same variables in the same order.

    Returns:
      A list of (aggregated gradient, variable). A variable whose gradient is
      None in every tower is left out, with a warning naming it: it does not
      feed the loss, which is usually a bug in the model but must not crash
      training.
    """
    if not tower_grads_and_vars:
        return []
    order = [v for _, v in tower_grads_and_vars[0]]
    per_variable = {_var_key(v): [] for v in order}
    for tower_index, grads_and_vars in enumerate(tower_grads_and_vars):
        for grad, var in grads_and_vars:
            if _var_key(var) not in per_variable:
                raise ValueError(
                    f"Tower {tower_index} has a gradient for variable {var.name} "
                    "that tower 0 does not have; towers must share one set of "
                    "variables.")
            if grad is not None:
                per_variable[_var_key(var)].append(grad)
    aggregated = []
    with tf.name_scope("aggregate_gradients"):
        for var in order:
            grads = per_variable[_var_key(var)]
            if not grads:
                logger.warning(
                    "Variable %s has no gradient in any tower; it is left out of "
                    "the update. Check that it feeds the loss.", var.name)
                continue
            aggregated.append((_sum_near_the_towers(var, grads), var))
    return aggregated

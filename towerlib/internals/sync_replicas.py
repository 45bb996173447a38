"""What towerlib.cluster relies on inside tf.compat.v1.train.SyncReplicasOptimizer.

`SyncReplicasTowerOptimizer` subclasses the stock optimizer and replaces its
queue-runner thread and its session hook; for that it reaches into state the
stock class keeps to itself. Every such reach is one function here, checked
against a real optimizer by tests/internals/test_internals_sync_replicas.py.
"""


def set_variables_to_average(sync_optimizer, variables):
    """Chooses, after construction, the variables the chief's moving average updates.

    Relies on the private attribute `SyncReplicasOptimizer._variables_to_average`,
    which `apply_gradients` passes to `variable_averages.apply(...)` when it
    builds the chief's aggregation op. The constructor takes the list, but the
    variables are only known once `grads_and_vars` reach `apply_gradients`, so
    it is set there, just before the stock `apply_gradients` reads it.

    Args:
      sync_optimizer: a SyncReplicasOptimizer built with `variable_averages`,
        whose `apply_gradients` has not run yet.
      variables: the variables to average (those with a gradient).
    """
    sync_optimizer._variables_to_average = list(variables)  # pylint: disable=protected-access


def gradients_applied(sync_optimizer):
    """Whether `apply_gradients` has built the synchronization ops yet.

    Relies on the private attribute `SyncReplicasOptimizer._gradients_applied`,
    False from construction and set True at the end of `apply_gradients`: the
    check the stock session hook makes before reading `chief_init_op` and
    `local_step_init_op`, which do not exist until then.
    """
    return sync_optimizer._gradients_applied  # pylint: disable=protected-access


def chief_aggregation_op(sync_optimizer):
    """The chief's op that aggregates one global step; call after apply_gradients.

    Running it takes the mean of the replicas' gradients from every
    accumulator (blocking until each has `replicas_to_aggregate` of them),
    applies it with the wrapped optimizer, increments the global step, hands
    out the next tokens and, with `variable_averages`, updates the moving
    averages.

    Relies on undocumented structure: the stock `apply_gradients` wraps that
    op, and nothing else, as the single enqueue op of the QueueRunner that
    `get_chief_queue_runner()` returns, meant for a background thread. towerlib
    runs it inside the chief's own step instead, so the thread never starts.
    """
    return sync_optimizer.get_chief_queue_runner().enqueue_ops[0]


def mark_ready_for_local_init_op_used(sync_optimizer):
    """Keeps TensorFlow from logging "Object was never used" for a graph never run.

    Relies on `tf.compat.v1.report_uninitialized_variables` returning, in graph
    mode, a `tf_should_use` wrapper (tensorflow/python/util/tf_should_use.py)
    that logs an error when garbage collected unused, and on that wrapper's
    `mark_used()` method. The stock `apply_gradients` stores such a wrapper as
    `ready_for_local_init_op`; towerlib's session hook runs it, but a graph
    that is built and never run would log the error. Without the wrapper
    there is nothing to silence and this does nothing.
    """
    getattr(sync_optimizer.ready_for_local_init_op, "mark_used", lambda: None)()

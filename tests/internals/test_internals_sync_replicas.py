"""The SyncReplicasOptimizer internals towerlib.internals.sync_replicas relies on.

Each test builds a stock tf.compat.v1.train.SyncReplicasOptimizer in its own
graph (one process, no servers) and fails with a message naming what a
TensorFlow release removed or changed, and which function relied on it.
"""

import gc
import logging

import numpy as np
import pytest
import tensorflow as tf

from towerlib.internals import sync_replicas as sync_internals

START_WEIGHTS = [1.0, 2.0]
LEARNING_RATE = 0.1


def broken(change, function, consequence):
    pytest.fail(f"TensorFlow {tf.__version__} {change}, which "
                f"towerlib.internals.sync_replicas.{function} relies on: {consequence}",
                pytrace=False)


def stock_optimizer(num_replicas=2, moving_average=False):
    """A stock SyncReplicasOptimizer over one [2] variable, loss sum(w^2).

    Returns (optimizer, grads_and_vars, global_step, weights, averages or None).
    """
    global_step = tf.compat.v1.train.get_or_create_global_step()
    weights = tf.compat.v1.get_variable("weights", initializer=START_WEIGHTS)
    loss = tf.reduce_sum(weights * weights)
    averages = None
    if moving_average:
        averages = tf.compat.v1.train.ExponentialMovingAverage(0.9, num_updates=global_step)
    optimizer = tf.compat.v1.train.SyncReplicasOptimizer(
        tf.compat.v1.train.GradientDescentOptimizer(LEARNING_RATE),
        replicas_to_aggregate=num_replicas, total_num_replicas=num_replicas,
        variable_averages=averages, variables_to_average=[] if averages else None)
    grads_and_vars = optimizer.compute_gradients(loss, [weights])
    return optimizer, grads_and_vars, global_step, weights, averages


def upstream_op_types(op):
    """The types of every op `op` needs: inputs and control inputs, transitively."""
    seen, stack = set(), [op]
    while stack:
        current = stack.pop()
        if current not in seen:
            seen.add(current)
            stack.extend(tensor.op for tensor in current.inputs)
            stack.extend(current.control_inputs)
    return {current.type for current in seen}


def test_variables_to_average_set_before_apply_gradients_get_a_moving_average():
    with tf.Graph().as_default():
        optimizer, grads_and_vars, global_step, weights, averages = stock_optimizer(
            moving_average=True)
        if not hasattr(optimizer, "_variables_to_average"):
            broken("removed SyncReplicasOptimizer._variables_to_average",
                   "set_variables_to_average",
                   "the chief's step cannot be told which weights to average")
        sync_internals.set_variables_to_average(optimizer, [weights])
        optimizer.apply_gradients(grads_and_vars, global_step)
        if averages.average(weights) is None:
            broken("no longer reads SyncReplicasOptimizer._variables_to_average in "
                   "apply_gradients", "set_variables_to_average",
                   "the weights set there got no moving average, so ema_decay would "
                   "silently average nothing")
        aggregation = optimizer.get_chief_queue_runner().enqueue_ops[0]
        if not {"AssignMovingAvg", "AssignSubVariableOp"} & upstream_op_types(aggregation):
            broken("no longer updates the moving averages in the chief's sync op",
                   "set_variables_to_average",
                   "the averages would never move during distributed training")


def test_gradients_applied_turns_true_in_apply_gradients():
    with tf.Graph().as_default():
        optimizer, grads_and_vars, global_step, _, _ = stock_optimizer()
        try:
            before = sync_internals.gradients_applied(optimizer)
        except AttributeError:
            broken("removed SyncReplicasOptimizer._gradients_applied",
                   "gradients_applied", "SyncReplicasInitHook.begin cannot check "
                   "that the train op was built")
        optimizer.apply_gradients(grads_and_vars, global_step)
        after = sync_internals.gradients_applied(optimizer)
    if (before, after) != (False, True):
        broken(f"changed SyncReplicasOptimizer._gradients_applied (before "
               f"apply_gradients: {before!r}, after: {after!r}; expected False, True)",
               "gradients_applied", "SyncReplicasInitHook.begin would refuse a built "
               "graph or accept an unbuilt one")


def test_the_chief_queue_runner_has_one_op_that_aggregates_the_step():
    with tf.Graph().as_default():
        optimizer, grads_and_vars, global_step, _, _ = stock_optimizer()
        optimizer.apply_gradients(grads_and_vars, global_step)
        enqueue_ops = optimizer.get_chief_queue_runner().enqueue_ops
        if len(enqueue_ops) != 1:
            broken(f"gives the chief's QueueRunner {len(enqueue_ops)} enqueue ops "
                   "instead of one", "chief_aggregation_op",
                   "the chief's step would run only part of the aggregation")
        needs = upstream_op_types(sync_internals.chief_aggregation_op(optimizer))
    expected = {"take the mean gradient": "TakeGradient",
                "apply it": "ApplyGradientDescent",
                "hand out the next tokens": "QueueEnqueueMany"}
    missing = [what for what, op_type in expected.items()
               if not any(op_type in needed for needed in needs)]
    if missing:
        broken("changed the op of the chief's QueueRunner", "chief_aggregation_op",
               f"it no longer does {', '.join(missing)} (its ops: {sorted(needs)})")


def test_the_chief_aggregation_op_runs_one_global_step_with_the_replica_step():
    """One replica, in process: its step and the aggregation apply the gradient once."""
    with tf.Graph().as_default():
        optimizer, grads_and_vars, global_step, weights, _ = stock_optimizer(num_replicas=1)
        replica_step = optimizer.apply_gradients(grads_and_vars, global_step)
        step = tf.group(replica_step, sync_internals.chief_aggregation_op(optimizer))
        with tf.compat.v1.Session() as session:
            session.run([tf.compat.v1.global_variables_initializer(),
                         tf.compat.v1.local_variables_initializer()])
            session.run(optimizer.chief_init_op)
            try:
                session.run(step, options=tf.compat.v1.RunOptions(timeout_in_ms=30000))
            except tf.errors.DeadlineExceededError:
                broken("changed the op of the chief's QueueRunner",
                       "chief_aggregation_op", "running it beside the replica's step "
                       "no longer hands out the token that step waits for (hung 30 s)")
            step_value, weight_values = session.run([global_step, weights])
    expected = np.array(START_WEIGHTS) * (1 - 2 * LEARNING_RATE)  # w - lr * 2w
    if step_value != 1 or not np.allclose(weight_values, expected):
        broken("changed the op of the chief's QueueRunner", "chief_aggregation_op",
               f"one step gave global_step {step_value} and weights {weight_values}, "
               f"not 1 and {expected}")


class _Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def never_used_errors_for_the_ready_op(mark_used):
    """TensorFlow's "Object was never used" errors about the ready op of a graph never run."""
    gc.collect()
    records = _Records()
    tf.get_logger().addHandler(records)
    try:
        with tf.Graph().as_default():
            optimizer, grads_and_vars, global_step, _, _ = stock_optimizer()
            optimizer.apply_gradients(grads_and_vars, global_step)
            if mark_used:
                sync_internals.mark_ready_for_local_init_op_used(optimizer)
            del optimizer
        gc.collect()
    finally:
        tf.get_logger().removeHandler(records)
    return [message for message in records.messages
            if "never used" in message and "report_uninitialized_variables" in message]


def test_marking_the_ready_op_used_keeps_an_unrun_graph_quiet():
    if not never_used_errors_for_the_ready_op(mark_used=False):
        pytest.skip(f"TensorFlow {tf.__version__} no longer logs 'never used' for "
                    "SyncReplicasOptimizer.ready_for_local_init_op, so "
                    "mark_ready_for_local_init_op_used has nothing to silence.")
    errors = never_used_errors_for_the_ready_op(mark_used=True)
    if errors:
        broken("changed how tf_should_use wrappers are marked used (mark_used())",
               "mark_ready_for_local_init_op_used",
               "every graph built and never run logs an error:\n" + errors[0])

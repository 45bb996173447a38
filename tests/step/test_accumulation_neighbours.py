"""The accumulation loop next to what else the graph holds.

The loop's body is a function graph with names and collections of its own
making: these tests build it next to an evaluation, a second training graph,
a numerics guard, grouped update ops and sync batch norm, and check that
each still computes what it does without accumulation.
"""

import contextlib

import numpy as np
import pytest
import tensorflow as tf

import towerlib
from tests import helpers
from towerlib.exchange import safety


def _session(num_towers=2):
    return tf.compat.v1.Session(config=towerlib.session_config(num_towers))


def test_a_numerics_guard_builds_and_stops_a_step_with_nan_in_a_micro_batch():
    images, labels = helpers.image_batch(8, seed=20)
    poisoned = images.copy()
    poisoned[5] = np.nan  # micro-batch 1 of 2
    with tf.Graph().as_default():
        feed = tf.compat.v1.placeholder(tf.float32, images.shape)
        guard = towerlib.guard_numerics(tf.compat.v1.train.GradientDescentOptimizer(0.1),
                                        check_gradients=True)
        train = towerlib.build_train_graph(
            helpers.conv_dense_model, (feed, tf.constant(labels)), guard,
            devices=helpers.cpu_devices(2), accumulation_steps=2)
        weights = [v for v in tf.compat.v1.trainable_variables() if v.op.name == "fc1/weights"][0]
        with _session() as session:
            train.initialize(session)
            before = session.run(weights)
            with pytest.raises(tf.errors.InvalidArgumentError) as raised:
                session.run(train.train_op, {feed: poisoned})
            assert guard.is_guard_error(raised.value)
            assert "tower 0" in str(guard.failure(session))  # row 5: micro-batch 1, tower 0
            np.testing.assert_array_equal(session.run(weights), before)
            session.run(train.train_op, {feed: images})
            assert not np.array_equal(session.run(weights), before)


def test_an_evaluation_built_first_does_not_leak_into_the_towers_losses():
    """The TF 1 tutorial's loss reads the 'losses' collection by the tower's scope: with
    an evaluation's 'tower_0/' entries already there, the loop's towers must not see them."""
    def tutorial_model(inputs, ctx):
        images, labels = inputs
        flat = tf.reshape(images, [-1, int(np.prod(images.shape[1:]))])
        logits = towerlib.layers.dense(flat, 3, name="logits")
        tf.compat.v1.add_to_collection("losses", tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)))
        return tf.add_n(tf.compat.v1.get_collection("losses", ctx.name_scope))

    batch = helpers.image_batch(8, seed=21)
    losses = {}
    for evaluation_first in (False, True):
        with tf.Graph().as_default():
            tf.compat.v1.set_random_seed(2)
            inputs = tuple(tf.constant(x) for x in batch)
            if evaluation_first:
                towerlib.build_towers(tutorial_model, inputs, devices=helpers.cpu_devices(2),
                                      is_training=False)
            with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope(),
                                             reuse=tf.compat.v1.AUTO_REUSE):
                train = towerlib.build_train_graph(
                    tutorial_model, inputs, tf.compat.v1.train.GradientDescentOptimizer(0.1),
                    devices=helpers.cpu_devices(2), accumulation_steps=2,
                    check_isolation=False)
            with _session() as session:
                train.initialize(session)
                losses[evaluation_first] = session.run(train.tower_losses)
    np.testing.assert_allclose(losses[True], losses[False], rtol=1e-6)


def _counting_model(name):
    def model(inputs, ctx):
        counter = tf.compat.v1.get_variable(f"{name}_count", [], tf.int32,
                                            initializer=tf.compat.v1.zeros_initializer(),
                                            trainable=False)
        tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.UPDATE_OPS,
                                       tf.group(counter.assign_add(1)))
        return helpers.conv_dense_model(inputs, ctx)
    return model


@pytest.mark.parametrize("first_k,second_k", [(1, 2), (2, 2), (2, 1)])
def test_two_training_graphs_in_one_graph_keep_their_own_update_ops(first_k, second_k):
    """Grouped update ops (tf.group) under all_towers: once per tower and step, each
    graph its own, whichever of the two accumulates."""
    with tf.Graph().as_default():
        inputs = tuple(tf.constant(x) for x in helpers.image_batch(8, seed=22))
        graphs = []
        for name, k in (("a", first_k), ("b", second_k)):
            with tf.compat.v1.variable_scope(name):
                graphs.append(towerlib.build_train_graph(
                    _counting_model(name), inputs,
                    tf.compat.v1.train.GradientDescentOptimizer(0.1),
                    devices=helpers.cpu_devices(2), accumulation_steps=k,
                    bn_mode="all_towers", global_step=tf.Variable(0, name="step")))
        counts = {v.op.name: v for v in tf.compat.v1.global_variables()
                  if v.op.name.endswith("_count")}
        graph = tf.compat.v1.get_default_graph()
        update_ops = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)
        assert all(getattr(op, "graph", graph) is graph for op in update_ops)  # groupable
        with _session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(tf.compat.v1.local_variables_initializer())
            session.run(graphs[1].train_op)
            assert session.run(counts["a/a_count"]) == 0
            assert session.run(counts["b/b_count"]) == 2  # 2 towers, once per step
            session.run(tf.group(tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)))


def test_an_input_function_entry_without_one_row_per_example_is_refused():
    batch = helpers.image_batch(4, seed=23)

    def input_fn(ctx):
        return tuple(tf.constant(x) for x in batch) + (tf.constant(0.5),)

    with tf.Graph().as_default():
        with pytest.raises(ValueError, match="not one row per example"):
            towerlib.build_train_graph(
                lambda inputs, ctx: helpers.conv_dense_model(inputs[:2], ctx), input_fn,
                tf.compat.v1.train.GradientDescentOptimizer(0.1),
                devices=helpers.cpu_devices(2), accumulation_steps=2)


def test_sync_batch_norm_collectives_in_the_loop_are_seen():
    with tf.Graph().as_default() as graph:
        helpers.build_on_image_batch(2, tower_fn=helpers.conv_bn_model, bn_mode="sync",
                                     accumulation_steps=2, exchange=towerlib.CollectiveExchange())
        assert safety.has_towerlib_collectives(graph)


def _trained_weights(accumulation_steps, container=None):
    images, labels = helpers.image_batch(8, seed=24)
    with tf.Graph().as_default():
        scope = tf.compat.v1.container(container) if container else contextlib.nullcontext()
        with scope:
            train = towerlib.build_train_graph(
                helpers.conv_dense_model, (tf.constant(images), tf.constant(labels)),
                tf.compat.v1.train.MomentumOptimizer(0.1, 0.9), devices=helpers.cpu_devices(2),
                accumulation_steps=accumulation_steps)
        weights = tf.compat.v1.trainable_variables()
        with _session() as session:
            train.initialize(session)
            helpers.load_values(session, weights, helpers.initial_values_for(weights))
            for _ in range(2):
                session.run(train.train_op)
            return {v.op.name: session.run(v) for v in weights}


def test_a_step_built_in_a_resource_container_accumulates_into_its_buffers():
    """The body names each buffer by a handle of its own: it must carry the container."""
    one_batch = _trained_weights(1)
    accumulated = _trained_weights(2, container="step_state")
    assert helpers.max_abs_difference(accumulated, one_batch) <= 1e-5

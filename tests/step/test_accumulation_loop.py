"""What the accumulation loop keeps across micro-batches, and what it does not.

The towers of an accumulated step run k times in one loop within the step's
session run (towerlib.step.micro_loop); the values crossing micro-batches live
in step-local variables. These tests check what a user sees of that: half
precision equals k = 1 within its tolerance, tower scalars are the whole
step's, nothing step-local is saved or left for the next step by a step cut
short, and summaries written inside the tower function are said to be left out.
"""

import numpy as np
import pytest
import tensorflow as tf

import towerlib
from tests import half_precision, helpers
from tests.step.test_accumulation import run


@pytest.mark.half_precision
@pytest.mark.parametrize("precision", ["bfloat16", "float16"])
def test_half_precision_with_accumulation_stays_near_float32(precision):
    """5 Momentum steps, k = 3, against float32 with k = 1 (tests/half_precision.py).

    Each step's gradient is the sum of k micro-batch gradients, each within 16 u of its
    own size; a micro-batch's gradient, the mean over a third of the examples, may be up
    to k times the step's where the micro-batches cancel. So within k * 16 u of how far
    float32 moved the weights and their Momentum slots (0.77): float16 1.8e-2, bfloat16
    1.4e-1 (measured 6.4e-3 and 1.6e-2 under both oneDNN settings; float16 with k = 1,
    4.5e-4: the micro-batches' partial gradients carry its error).
    """
    k = 3
    batch = helpers.image_batch(12, seed=11)
    accumulated, train, _ = run(helpers.conv_dense_model, batch, "momentum", 2, k,
                                precision=precision)
    exact, _, _ = run(helpers.conv_dense_model, batch, "momentum", 2, 1)
    error = helpers.max_abs_difference({name: accumulated[name] for name in exact}, exact)
    start = helpers.initial_values_like(
        {name: v for name, v in exact.items() if not name.endswith("/Momentum")})
    start.update({name: np.zeros_like(v) for name, v in exact.items()
                  if name.endswith("/Momentum")})
    moved = half_precision.motion(exact, start)
    assert 0 < error <= k * half_precision.trained_atol(precision, moved)
    assert (train.loss_scale is not None) == (precision == "float16")


def _precision_model(inputs, ctx):
    loss = helpers.conv_dense_model(inputs, ctx)
    towerlib.tower_scalar(ctx, "mean_label", tf.reduce_mean(tf.cast(inputs[1], tf.float32)))
    return loss


def test_tower_scalars_and_the_loss_are_the_whole_steps():
    batch = helpers.image_batch(11, seed=12)  # micro-batches 6 and 5, shards 3+3 and 3+2
    fetched = {}
    for k in (1, 2):
        with tf.Graph().as_default():
            tf.compat.v1.set_random_seed(1)
            train = towerlib.build_train_graph(
                _precision_model, tuple(tf.constant(x) for x in batch),
                tf.compat.v1.train.GradientDescentOptimizer(0.1),
                devices=helpers.cpu_devices(2), accumulation_steps=k)
            with tf.compat.v1.Session(config=towerlib.session_config(2)) as session:
                session.run(tf.compat.v1.global_variables_initializer())
                fetched[k] = session.run([train.scalars["mean_label"], train.loss,
                                          train.tower_shares, train.train_op])[:3]
    np.testing.assert_allclose(fetched[2][0], batch[1].mean(), rtol=1e-6)
    np.testing.assert_allclose(fetched[2][0], fetched[1][0], rtol=1e-6)
    np.testing.assert_allclose(fetched[2][1], fetched[1][1], rtol=1e-6)
    np.testing.assert_allclose(fetched[2][2], [6 / 11, 5 / 11], rtol=1e-6)


def test_step_local_values_are_not_saved_and_a_step_cut_short_leaves_nothing_behind():
    """A NaN in micro-batch 1 stops the step after micro-batch 0 wrote its gradients;
    the next step is the same as a first step with the same weights."""
    def checked_model(inputs, ctx):
        images, labels = inputs
        images = tf.debugging.check_numerics(images, "bad input")
        return helpers.conv_dense_model((images, labels), ctx)

    images, labels = helpers.image_batch(8, seed=13)
    poisoned = images.copy()
    poisoned[6] = np.nan  # micro-batch 1 of 2 (rows 4-7)
    results = []
    for first_feed in (poisoned, None):
        with tf.Graph().as_default():
            tf.compat.v1.set_random_seed(3)
            feed = tf.compat.v1.placeholder(tf.float32, images.shape)
            train = towerlib.build_train_graph(
                checked_model, (feed, tf.constant(labels)),
                tf.compat.v1.train.GradientDescentOptimizer(0.1),
                devices=helpers.cpu_devices(2), accumulation_steps=2)
            kept = {handle.op.name for handle in train.accumulation_buffers}
            variables = {v.op.name for v in tf.compat.v1.global_variables()
                         + tf.compat.v1.local_variables()}
            assert kept and not kept & variables, (kept, variables)
            assert {handle.op.type for handle in train.accumulation_buffers} == {"VarHandleOp"}
            with tf.compat.v1.Session(config=towerlib.session_config(2)) as session:
                session.run(tf.compat.v1.global_variables_initializer())
                if first_feed is not None:
                    with pytest.raises(tf.errors.InvalidArgumentError, match="bad input"):
                        session.run(train.train_op, {feed: first_feed})
                session.run(train.train_op, {feed: images})
                results.append({v.op.name: session.run(v)
                                for v in tf.compat.v1.trainable_variables()})
    assert helpers.max_abs_difference(results[0], results[1]) == 0.0


def test_summaries_written_inside_the_tower_function_are_left_out_with_a_warning(caplog):
    def model(inputs, ctx):
        loss = helpers.conv_dense_model(inputs, ctx)
        tf.compat.v1.summary.scalar("own_loss", loss)
        return loss

    with tf.Graph().as_default():
        with caplog.at_level("WARNING"):
            train = helpers.build_on_image_batch(2, tower_fn=model, accumulation_steps=2)
        assert "towerlib.tower_scalar" in caplog.text and "own_loss" in caplog.text
        merged = tf.compat.v1.summary.merge_all()
        with tf.compat.v1.Session(config=towerlib.session_config(2)) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            summary = tf.compat.v1.Summary.FromString(session.run([merged, train.train_op])[0])
        assert "loss" in {value.tag for value in summary.value}


def test_a_traced_accumulated_step_counts_the_loops_ops_as_the_towers():
    """The loop's body runs as 'accumulation/micro_batch_loop/body/_1/tower_i/...':
    compute of tower i, its buffer writes tower i's aggregation (towerlib.trace)."""
    with tf.Graph().as_default():
        train = helpers.build_on_image_batch(2, tower_fn=helpers.conv_dense_model,
                                             batch_size=8, accumulation_steps=2)
        with tf.compat.v1.Session(config=towerlib.session_config(2)) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            metadata = tf.compat.v1.RunMetadata()
            session.run(train.train_op, run_metadata=metadata, options=tf.compat.v1.RunOptions(
                trace_level=tf.compat.v1.RunOptions.FULL_TRACE))
    names = [n.node_name for d in metadata.step_stats.dev_stats for n in d.node_stats]
    convolutions = [n for n in names if n.endswith("Conv2DBackpropFilter") and "/body/" in n]
    assert {towerlib.trace.phases.tower_index(n) for n in convolutions} == {0, 1}
    assert {towerlib.trace.phases.classify(n, "Conv2DBackpropFilter")
            for n in convolutions} == {"compute"}
    writes = [n for n in names if "/accumulate_tower_" in n and "AssignAdd" in n]
    assert writes and {towerlib.trace.phases.classify(n) for n in writes} == {"apply"}
    profile = towerlib.trace.analyze_step(metadata, train.devices)
    assert all(tower.compute_micros > 0 for tower in profile.towers)

"""Evaluation on every tower equals evaluation on one device, also on uneven shards."""

import numpy as np
import pytest
import tensorflow as tf

import towerlib
from tests import helpers
from towerlib import layers


def model_logits(images, ctx):
    h = layers.conv2d(images, 4, 3, name="conv1", use_bias=False)
    h = tf.nn.relu(towerlib.batch_norm(h, ctx, name="bn1"))
    return layers.dense(layers.flatten(h), helpers.NUM_CLASSES, name="logits")


def train_fn(inputs, ctx):
    images, labels = inputs
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=labels, logits=model_logits(images, ctx)))


def metric_fn(inputs, ctx):
    images, labels = inputs
    logits = model_logits(images, ctx)
    predictions = tf.argmax(logits, axis=1, output_type=tf.int32)
    return {"correct": tf.cast(tf.equal(predictions, labels), tf.int32),
            "cross_entropy": tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels=labels, logits=logits)}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A checkpoint of 20 steps on 2 towers, trained once for the module."""
    tmp_path = tmp_path_factory.mktemp("trained")
    with tf.Graph().as_default():
        batch = tuple(tf.constant(x) for x in helpers.image_batch(16, seed=1))
        train = towerlib.build_train_graph(
            train_fn, batch, tf.compat.v1.train.MomentumOptimizer(0.1, 0.9),
            devices=helpers.cpu_devices(2), bn_mode="all_towers")
        towerlib.run_training(train, train_dir=str(tmp_path), max_steps=20,
                              session_config=towerlib.session_config(2),
                              save_summaries_steps=None)
    return towerlib.find_restorable_checkpoint(str(tmp_path))


def _evaluate(checkpoint, num_towers, batches):
    with tf.Graph().as_default():
        images = tf.compat.v1.placeholder(tf.float32, [None, 6, 6, 2])
        labels = tf.compat.v1.placeholder(tf.int32, [None])
        evaluation = towerlib.build_eval_graph(
            metric_fn, (images, labels), devices=helpers.cpu_devices(num_towers))
        with tf.compat.v1.Session(config=towerlib.session_config(num_towers)) as session:
            tf.compat.v1.train.Saver().restore(session, checkpoint)
            session.run(tf.compat.v1.local_variables_initializer())
            for batch_images, batch_labels in batches:
                session.run(evaluation.update_op, {images: batch_images, labels: batch_labels})
            return session.run([evaluation.totals, evaluation.examples, evaluation.values])


@pytest.mark.parametrize("num_towers", [3, 4])
def test_multi_tower_evaluation_equals_one_device(checkpoint, num_towers):
    # 10 + 7 examples: neither batch divides by 3 or 4.
    batches = [helpers.image_batch(10, seed=7), helpers.image_batch(7, seed=8)]
    one_totals, one_examples, one_values = _evaluate(checkpoint, 1, batches)
    totals, examples, values = _evaluate(checkpoint, num_towers, batches)
    assert examples == one_examples == 17
    assert totals["correct"] == one_totals["correct"]
    assert 0 < one_totals["correct"] < 17  # a real, not a trivial, precision
    assert values["correct"] == one_values["correct"] == one_totals["correct"] / 17
    np.testing.assert_allclose(values["cross_entropy"], one_values["cross_entropy"],
                               rtol=1e-6)


def test_evaluation_next_to_the_training_graph_reads_its_variables():
    with tf.Graph().as_default():
        batch = tuple(tf.constant(x) for x in helpers.image_batch(9, seed=2))
        train = towerlib.build_train_graph(
            train_fn, batch, tf.compat.v1.train.GradientDescentOptimizer(0.1),
            devices=helpers.cpu_devices(3))
        trained = tf.compat.v1.global_variables()
        evaluation = towerlib.build_eval_graph(metric_fn, batch,
                                               devices=helpers.cpu_devices(3),
                                               reuse_variables=True)
        assert tf.compat.v1.global_variables() == trained  # no second copy
        with tf.compat.v1.Session(config=towerlib.session_config(3)) as session:
            session.run([tf.compat.v1.global_variables_initializer(),
                         tf.compat.v1.local_variables_initializer()])
            session.run(train.train_op)
            session.run(evaluation.update_op)
            session.run(evaluation.update_op)
            assert session.run(evaluation.examples) == 18
            session.run(evaluation.reset_op)
            assert session.run(evaluation.examples) == 0


def test_a_mean_instead_of_per_example_values_is_refused():
    def mean_metric(inputs, ctx):
        return {"precision": tf.reduce_mean(tf.cast(metric_fn(inputs, ctx)["correct"],
                                                    tf.float32))}

    with tf.Graph().as_default():
        batch = tuple(tf.constant(x) for x in helpers.image_batch(6))
        with pytest.raises(ValueError, match="one value per example"):
            towerlib.build_eval_graph(mean_metric, batch, devices=helpers.cpu_devices(2))


def test_a_metric_of_another_length_than_the_examples_is_refused():
    def wrong_length(inputs, ctx):
        images, labels = inputs
        return {"correct": tf.cast(tf.equal(labels, labels), tf.int32),
                "doubled": tf.concat([labels, labels], axis=0)}

    with tf.Graph().as_default():
        batch = tuple(tf.constant(x) for x in helpers.image_batch(6))
        with pytest.raises(ValueError, match="'doubled' has 6 values but tower 0 has 3"):
            towerlib.build_eval_graph(wrong_length, batch, devices=helpers.cpu_devices(2))

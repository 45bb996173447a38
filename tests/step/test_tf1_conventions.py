"""TF 1 code brought as it is: the cifar10_multi_gpu_train.py tutorial's conventions.

The model below is written the tutorial's way (variables through
`_variable_on_cpu`, weight decay added to the 'losses' collection, a `loss()`
that sums the whole collection and a `tower_loss(scope)` that sums the
tower's own entries) and compared with plain one-device TF 1 training on the
whole batch.
"""

import logging
import re

import numpy as np
import pytest
import tensorflow as tf

import towerlib
from tests import helpers
from towerlib.checks.tower_batch import BatchSizeMismatchError
from towerlib.checks.tower_isolation import TowerIsolationError

WEIGHT_DECAY = 0.05


def _variable_on_cpu(name, shape, initializer):
    with tf.device("/cpu:0"):
        return tf.compat.v1.get_variable(name, shape, initializer=initializer,
                                         dtype=tf.float32)


def _variable_with_weight_decay(name, shape, stddev, wd, first_creation_only):
    var = _variable_on_cpu(
        name, shape, tf.compat.v1.truncated_normal_initializer(stddev=stddev))
    reused = tf.compat.v1.get_variable_scope().reuse
    if wd is not None and not (first_creation_only and reused):
        weight_decay = tf.multiply(tf.nn.l2_loss(var), wd, name="weight_loss")
        tf.compat.v1.add_to_collection("losses", weight_decay)
    return var


def inference(images, batch_size=None, first_creation_only=False):
    """[n, 6, 6, 2] images -> [n, 3] logits; the tutorial's layers, smaller."""
    with tf.compat.v1.variable_scope("conv1") as scope:
        kernel = _variable_with_weight_decay("weights", [3, 3, 2, 4], 0.3,
                                             WEIGHT_DECAY, first_creation_only)
        conv = tf.nn.conv2d(images, kernel, [1, 1, 1, 1], padding="SAME")
        biases = _variable_on_cpu("biases", [4], tf.constant_initializer(0.1))
        conv1 = tf.nn.relu(conv + biases, name=scope.name)
    pool1 = tf.nn.max_pool2d(conv1, 2, 2, padding="SAME", name="pool1")
    with tf.compat.v1.variable_scope("local3") as scope:
        # The tutorial hard-codes its per-GPU batch here: [FLAGS.batch_size, -1].
        reshape = tf.reshape(pool1, [batch_size, -1] if batch_size else [-1, 36])
        dim = reshape.get_shape()[1]
        weights = _variable_with_weight_decay("weights", [dim, 8], 0.3, WEIGHT_DECAY,
                                              first_creation_only)
        biases = _variable_on_cpu("biases", [8], tf.constant_initializer(0.1))
        local3 = tf.nn.relu(tf.matmul(reshape, weights) + biases, name=scope.name)
    with tf.compat.v1.variable_scope("softmax_linear") as scope:
        weights = _variable_with_weight_decay("weights", [8, 3], 0.3, None,
                                              first_creation_only)
        biases = _variable_on_cpu("biases", [3], tf.constant_initializer(0.0))
        return tf.add(tf.matmul(local3, weights), biases, name=scope.name)


def loss(logits, labels):
    """The single-GPU tutorial's loss(): the WHOLE 'losses' collection."""
    cross_entropy = tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=tf.cast(labels, tf.int64), logits=logits, name="cross_entropy_per_example")
    cross_entropy_mean = tf.reduce_mean(cross_entropy, name="cross_entropy")
    tf.compat.v1.add_to_collection("losses", cross_entropy_mean)
    return tf.add_n(tf.compat.v1.get_collection("losses"), name="total_loss")


def tower_loss(scope, images, labels, batch_size=None, first_creation_only=False):
    """The multi-GPU tutorial's tower_loss(scope): the tower's own 'losses' entries."""
    logits = inference(images, batch_size, first_creation_only)
    _ = loss(logits, labels)
    losses = tf.compat.v1.get_collection("losses", scope)
    return tf.add_n(losses, name="total_loss")


def tutorial_tower(first_creation_only=False):
    def tower_fn(inputs, ctx):
        images, labels = inputs
        return tower_loss(ctx.name_scope, images, labels,
                          first_creation_only=first_creation_only)
    return tower_fn


def reference_run(batches):
    """One device, whole batch: loss() = cross entropy + weight decay, SGD."""
    with tf.Graph().as_default():
        images = tf.compat.v1.placeholder(tf.float32, [None, 6, 6, 2])
        labels = tf.compat.v1.placeholder(tf.int32, [None])
        total = loss(inference(images), labels)
        weight_decay = tf.add_n([t for t in tf.compat.v1.get_collection("losses")
                                 if "weight_loss" in t.name])
        train_op = helpers.make_optimizer("sgd").minimize(total)
        variables = helpers.model_variables()
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            helpers.load_values(session, variables, helpers.initial_values_for(variables))
            history = []
            for x, y in batches:
                feed = {images: x, labels: y}
                history.append(session.run([total - weight_decay, weight_decay], feed))
                session.run(train_op, feed)
            return history, {v.op.name: session.run(v) for v in variables}


def tower_run(tower_fn, batches, num_towers):
    with tf.Graph().as_default():
        images = tf.compat.v1.placeholder(tf.float32, [len(batches[0][0]), 6, 6, 2])
        labels = tf.compat.v1.placeholder(tf.int32, [len(batches[0][0])])
        train = towerlib.build_train_graph(
            tower_fn, (images, labels), helpers.make_optimizer("sgd"),
            devices=helpers.cpu_devices(num_towers), summaries=False)
        variables = helpers.model_variables()
        with tf.compat.v1.Session(config=towerlib.session_config(num_towers)) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            helpers.load_values(session, variables, helpers.initial_values_for(variables))
            history = []
            for x, y in batches:
                feed = {images: x, labels: y}
                history.append(session.run([train.loss, train.regularization_loss], feed))
                session.run(train.train_op, feed)
            return history, {v.op.name: session.run(v) for v in variables}


@pytest.mark.parametrize("first_creation_only", [False, True],
                         ids=["decay_in_every_tower", "decay_in_tower_0_only"])
def test_tutorial_model_reports_loss_and_regularization_and_trains_like_one_device(
        first_creation_only):
    batches = helpers.image_batches(16, steps=4, seed=3)
    want_history, want_weights = reference_run(batches)
    history, weights = tower_run(tutorial_tower(first_creation_only), batches, 4)
    np.testing.assert_allclose(np.array(history), np.array(want_history), rtol=1e-5)
    assert np.array(history)[:, 1].min() > 0.01  # the weight decay is really there
    assert helpers.max_abs_difference(weights, want_weights) < 1e-5


def test_regularization_returned_inside_the_loss_is_not_counted_twice():
    """A tower adding its REGULARIZATION_LOSSES terms itself (towerlib adds them too)."""
    def tower_fn(inputs, ctx):
        data_loss = helpers.conv_dense_model(inputs, ctx)
        return tf.add_n([data_loss] + tf.compat.v1.losses.get_regularization_losses())

    def loss_and_regularization(fn):
        with tf.Graph().as_default():
            train = helpers.build_on_image_batch(2, tower_fn=fn)
            variables = helpers.model_variables()
            with tf.compat.v1.Session(config=towerlib.session_config(2)) as session:
                session.run(tf.compat.v1.global_variables_initializer())
                helpers.load_values(session, variables,
                                    helpers.initial_values_for(variables))
                return session.run([train.loss, train.regularization_loss])

    want = loss_and_regularization(helpers.conv_dense_model)
    got = loss_and_regularization(tower_fn)
    assert want[1] > 0
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_unscoped_collection_read_names_the_other_towers_op():
    def tower_fn(inputs, ctx):
        images, labels = inputs
        return loss(inference(images), labels)  # every tower's 'losses' so far

    with tf.Graph().as_default(), pytest.raises(TowerIsolationError) as raised:
        helpers.build_on_image_batch(4, tower_fn=tower_fn, batch_size=16)
    message = str(raised.value)
    assert "Tower 1's loss" in message
    assert "tower_0/cross_entropy" in message
    assert "'losses'" in message
    assert "get_collection('losses', ctx.name_scope)" in message


def test_a_cached_tensor_without_examples_is_not_a_crossing():
    cache = {}

    def tower_fn(inputs, ctx):
        images, labels = inputs
        if "scale" not in cache:  # built in tower 0, reused by the others
            cache["scale"] = tf.constant(2.0) * tf.ones([])
        return cache["scale"] * tf.reduce_mean(inference(images))

    with tf.Graph().as_default():
        helpers.build_on_image_batch(2, tower_fn=tower_fn)


def test_isolation_check_can_be_turned_off():
    def tower_fn(inputs, ctx):
        images, labels = inputs
        return loss(inference(images, first_creation_only=True), labels)

    with tf.Graph().as_default():
        helpers.build_on_image_batch(2, tower_fn=tower_fn, check_isolation=False)


def test_hard_coded_per_gpu_batch_names_both_numbers():
    """The tutorial's --batch_size=16 per GPU, fed as a global batch of 16 on 4 towers."""
    def tower_fn(inputs, ctx):
        images, labels = inputs
        return tower_loss(ctx.name_scope, images, labels, batch_size=16)

    with tf.Graph().as_default(), pytest.raises(BatchSizeMismatchError) as raised:
        # [4, 3, 3, 4] pooled -> [16, 9]: TF fails at the loss, labels (4,), logits (16, 3).
        helpers.build_on_image_batch(4, tower_fn=tower_fn, batch_size=16)
    message = str(raised.value)
    assert "labels.shape=(4,) and logits.shape=(16, 3)" in message
    assert "Tower 0 got 4 examples" in message
    assert "global batch of 16 over 4 towers" in message
    assert "tower_0/local3/Reshape" in message
    assert "4 x 16 = 64" in message


def test_reshape_to_the_global_batch_is_refused_even_when_tensorflow_does_not_fail():
    def tower_fn(inputs, ctx):
        images, labels = inputs
        rows = tf.reshape(images, [8, -1])  # 4 examples' pixels spread over 8 rows
        return tf.reduce_mean(tf.matmul(rows, tf.compat.v1.get_variable("w", [36, 1])))

    with tf.Graph().as_default(), pytest.raises(BatchSizeMismatchError) as raised:
        helpers.build_on_image_batch(2, tower_fn=tower_fn, batch_size=8)
    assert "Tower 0 got 4 examples" in str(raised.value)
    assert "global batch of 8" in str(raised.value)


def test_folding_into_the_batch_with_minus_one_is_allowed():
    def tower_fn(inputs, ctx):
        images, labels = inputs
        rows = tf.reshape(images, [-1, 36])  # [4, 6, 6, 2] -> [8, 36]: legitimate
        return tf.reduce_mean(tf.matmul(rows, tf.compat.v1.get_variable("w", [36, 1])))

    with tf.Graph().as_default():
        helpers.build_on_image_batch(2, tower_fn=tower_fn, batch_size=8)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static_batch", "dynamic_batch"])
def test_run_training_logs_examples_per_sec_without_examples_per_step(
        tmp_path, caplog, dynamic):
    images, labels = helpers.image_batch(12)
    with tf.Graph().as_default():
        inputs = (tf.constant(images), tf.constant(labels))
        if dynamic:
            inputs = tuple(tf.compat.v1.placeholder_with_default(
                t, [None] + t.shape.as_list()[1:]) for t in inputs)
        train = towerlib.build_train_graph(
            helpers.conv_dense_model, inputs, helpers.make_optimizer("sgd"),
            devices=helpers.cpu_devices(2), summaries=False)
        assert isinstance(towerlib.run.loop_hooks.examples_per_step_of(train),
                          tf.Tensor if dynamic else int)
        with caplog.at_level(logging.INFO, logger="towerlib"):
            towerlib.run_training(
                train, train_dir=str(tmp_path), max_steps=4, log_every_n_steps=2,
                session_config=towerlib.session_config(2), save_summaries_steps=None,
                stop_on_signals=())
    lines = [r.getMessage() for r in caplog.records if "loss =" in r.getMessage()]
    assert len(lines) == 2, lines
    assert all("examples/sec" in line and "sec/batch" in line for line in lines)
    # The progress of the run and an estimate of the time left end each line.
    assert [re.search(r"; (\d+)/4, about \d+m\d\ds left$", line).group(1)
            for line in lines] == ["2", "4"], lines


def test_explicit_examples_per_step_wins():
    hook = towerlib.StepLogger(tf.constant(1.0), tf.constant(0, tf.int64),
                               examples_per_step=7)
    assert hook.examples_per_step == 7

"""accumulation_steps=k: one optimizer step over k micro-batches per tower.

Without batch norm the step is one device's on the whole global batch. With
batch norm, normalization uses each micro-batch's statistics (per tower, or
across the towers with sync), and the references are built to compute the
same: k micro-batches on N towers normalize like k x N towers without
accumulation ('all_towers'), or like k micro-batches on one device ('sync').
"""

import numpy as np
import pytest
import tensorflow as tf

import towerlib
from tests import helpers
from towerlib import layers

TOLERANCE = 1e-5


def _optimizer(kind):
    if kind == "adam":
        return tf.compat.v1.train.AdamOptimizer(0.01)
    return helpers.make_optimizer(kind)


def _model_variables():
    return [v for v in helpers.model_variables()
            if "Adam" not in v.op.name and not v.op.name.endswith("_power")
            and not v.op.name.startswith("loss_scale")]


def run(model_fn, batch, optimizer_kind, num_towers, accumulation_steps, steps=5,
        feed=False, inputs=None, **options):
    """Trains; returns (every saved variable by name, train graph, global step)."""
    graph = tf.Graph()
    with graph.as_default():
        feed_dict = None
        if inputs is None and feed:
            placeholders = tuple(
                tf.compat.v1.placeholder(tf.as_dtype(x.dtype), [None] + list(x.shape[1:]))
                for x in batch)
            inputs, feed_dict = placeholders, dict(zip(placeholders, batch))
        elif inputs is None:
            inputs = tuple(tf.constant(x) for x in batch)
        train = towerlib.build_train_graph(
            model_fn, inputs, _optimizer(optimizer_kind),
            devices=helpers.cpu_devices(num_towers), accumulation_steps=accumulation_steps,
            **options)
        start = helpers.initial_values_for(_model_variables())
        config = towerlib.session_config(num_towers, allow_soft_placement=False)
        with tf.compat.v1.Session(config=config) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            helpers.load_values(session, _model_variables(), start)
            session.run(tf.compat.v1.local_variables_initializer())
            for _ in range(steps):
                session.run(train.train_op, feed_dict)
            values = {v.op.name: session.run(v) for v in tf.compat.v1.global_variables()
                      if "global_step" not in v.op.name}
            return values, train, session.run(train.global_step)


def _assert_close(left, right, tolerance=TOLERANCE):
    assert helpers.max_abs_difference(left, right) <= tolerance


SLOW = pytest.mark.slow


@pytest.mark.parametrize("num_towers,accumulation_steps", [
    (2, 2), pytest.param(3, 4, marks=SLOW), (1, 4)])
def test_dense_model_equals_one_device_on_the_whole_batch(num_towers, accumulation_steps):
    batch = helpers.image_batch(17)  # uneven everywhere
    accumulated, train, step = run(helpers.conv_dense_model, batch, "momentum", num_towers,
                                   accumulation_steps)
    assert step == 5  # one global step per optimizer step, not per micro-batch
    reference = helpers.run_reference(helpers.conv_dense_model, batch, "momentum")
    _assert_close({k: accumulated[k] for k in reference}, reference)
    # Slots too: the same as towerlib without accumulation (itself one device's).
    plain, _, _ = run(helpers.conv_dense_model, batch, "momentum", num_towers, 1)
    _assert_close(accumulated, plain)
    assert len(train.tower_losses) == len(train.tower_shares) == num_towers


@pytest.mark.parametrize("optimizer_kind", ["adam"])
def test_other_optimizers_match_no_accumulation(optimizer_kind):
    batch = helpers.image_batch(12, seed=1)
    accumulated, _, _ = run(helpers.conv_dense_model, batch, optimizer_kind, 2, 3)
    plain, _, _ = run(helpers.conv_dense_model, batch, optimizer_kind, 2, 1)
    _assert_close(accumulated, plain)


@pytest.mark.parametrize("num_towers", [pytest.param(1, marks=SLOW), 2])
def test_sparse_gradients(num_towers):
    batch = helpers.id_batch(10)
    accumulated, train, _ = run(helpers.embedding_model, batch, "momentum", num_towers, 2)
    reference = helpers.run_reference(helpers.embedding_model, batch, "momentum")
    _assert_close({k: accumulated[k] for k in reference}, reference)
    table_grads = [g for g, v in train.grads_and_vars if "embed" in v.op.name]
    assert type(table_grads[0]).__name__ == "IndexedSlices"


def test_replicated_variables_with_accumulation():
    batch = helpers.image_batch(12, seed=2)
    replicated, train, _ = run(helpers.conv_bn_model, batch, "momentum", 2, 2,
                               update="replicated", bn_mode="all_towers")
    server, _, _ = run(helpers.conv_bn_model, batch, "momentum", 2, 2, bn_mode="all_towers")
    _assert_close(replicated, server)
    assert train.variable_copies


def test_all_towers_over_micro_batches_is_all_towers_over_as_many_towers():
    """k=2 micro-batches on 2 towers normalize the same 4 shards as 4 towers, and
    'all_towers' pools the moving statistics over all of them: the same run.

    Shards of 4 examples: with 2, batch norm's 1 / std over two examples amplifies
    float32 rounding to 3e-5-5e-5 after 5 steps whenever the convolutions' kernels
    sum in another order (TF_ENABLE_ONEDNN_OPTS=0, with or without the loop)."""
    batch = helpers.image_batch(16, seed=3)
    accumulated, _, _ = run(helpers.conv_bn_model, batch, "momentum", 2, 2,
                            bn_mode="all_towers")
    four_towers, _, _ = run(helpers.conv_bn_model, batch, "momentum", 4, 1,
                            bn_mode="all_towers")
    _assert_close(accumulated, four_towers)
    assert not np.allclose(accumulated["bn_fc1/moving_mean"], 0.0)


def test_sync_over_micro_batches_is_one_device_per_micro_batch():
    """'sync' normalizes each micro-batch with its statistics across the towers:
    the same as one device accumulating the same micro-batches."""
    batch = helpers.image_batch(12, seed=4)
    synchronized, _, _ = run(helpers.conv_bn_model, batch, "momentum", 3, 2, bn_mode="sync")
    one_device, _, _ = run(helpers.conv_bn_model, batch, "momentum", 1, 2)
    _assert_close(synchronized, one_device)


def test_first_tower_pools_tower_0s_micro_batches():
    """After one step, the first layer's moving statistics are one device's on
    tower 0's examples of both micro-batches (rows 0-1 and 4-5 of 8)."""
    batch = helpers.image_batch(8, seed=5)
    accumulated, _, _ = run(helpers.conv_bn_model, batch, "sgd", 2, 2, steps=1)
    tower_0_rows = tuple(np.concatenate([x[0:2], x[4:6]]) for x in batch)
    reference = helpers.run_reference(helpers.conv_bn_model, tower_0_rows, "sgd", steps=1)
    for name in ("bn_conv1/moving_mean", "bn_conv1/moving_variance"):
        np.testing.assert_allclose(accumulated[name], reference[name], atol=TOLERANCE)


def test_dynamic_batch_and_input_functions():
    batch = helpers.image_batch(13, seed=6)
    reference = helpers.run_reference(helpers.conv_dense_model, batch, "momentum")
    fed, _, _ = run(helpers.conv_dense_model, batch, "momentum", 2, 3, feed=True)
    _assert_close({k: fed[k] for k in reference}, reference)

    bounds = {(0, 0): (0, 3), (0, 1): (3, 5), (1, 0): (5, 9), (1, 1): (9, 13)}
    seen = []

    def input_fn(ctx):
        seen.append((ctx.micro_batch, ctx.index))
        start, stop = bounds[ctx.micro_batch, ctx.index]
        return tuple(tf.constant(x[start:stop]) for x in batch)

    per_tower, _, _ = run(helpers.conv_dense_model, batch, "momentum", 2, 2,
                          inputs=input_fn)
    assert sorted(seen) == sorted(bounds)
    _assert_close({k: per_tower[k] for k in reference}, reference)


def test_the_towers_are_built_once_in_a_loop_that_runs_one_micro_batch_at_a_time():
    """Micro-batch j + 1 starts after micro-batch j's writes (one micro-batch's
    activations alive at a time), and nothing of the towers is outside the loop."""
    with tf.Graph().as_default() as graph:
        train = helpers.build_on_image_batch(2, tower_fn=helpers.conv_dense_model,
                                             accumulation_steps=3)
        (loop,) = [op for op in graph.get_operations() if op.type in ("While", "StatelessWhile")]
        assert loop.get_attr("parallel_iterations") == 1
        assert not [op.name for op in graph.get_operations() if "tower_1/" in op.name
                    and op.type in ("Conv2D", "MatMul")]
        body = graph._get_function(loop.get_attr("body").name)  # pylint: disable=protected-access
        # The counter's next value waits for every tower's writes, each on its tower's device.
        nodes = {node.name: node for node in body.definition.node_def}
        waits = {i[1:] for node in nodes.values() if node.name.startswith("add")
                 for i in node.input if i.startswith("^")}
        written = {(nodes[name].op, nodes[name].device) for name in waits}
        assert {("AssignAddVariableOp", f"/device:CPU:{i}") for i in (0, 1)} <= written, written
        assert train.tower_outputs[0] == {}


@pytest.mark.parametrize("steps", [0, -1, 1.5, True, "2"])
def test_bad_accumulation_steps_are_refused(steps):
    with tf.Graph().as_default():
        with pytest.raises(ValueError, match="accumulation_steps"):
            helpers.build_on_image_batch(2, accumulation_steps=steps)


def test_a_global_batch_smaller_than_micro_batches_times_towers_is_refused():
    with tf.Graph().as_default():
        with pytest.raises(ValueError, match="3 x 2 = 6"):
            helpers.build_on_image_batch(2, batch_size=5, accumulation_steps=3)


def test_a_fed_batch_too_small_fails_at_run_time_with_the_reason():
    batch = helpers.image_batch(5)
    with pytest.raises(tf.errors.InvalidArgumentError, match="accumulation_steps x towers"):
        run(helpers.conv_dense_model, batch, "sgd", 2, 3, feed=True, steps=1)


def test_regularization_inside_the_tower_loss_counts_once_over_micro_batches():
    """A tower returning data loss + add_n(REGULARIZATION_LOSSES): the same step
    and the same reported losses with k = 1, 2 and 4 (the review's case)."""
    def model(inputs, ctx):
        images, labels = inputs
        logits = layers.dense(layers.flatten(images), 3, name="fc", weight_decay=0.1)
        data = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=labels, logits=logits))
        return data + tf.add_n(tf.compat.v1.losses.get_regularization_losses())

    batch = helpers.image_batch(8, seed=9)
    results = {}
    for k in (1, 2, 4):
        with tf.Graph().as_default():
            tf.compat.v1.set_random_seed(0)
            inputs = tuple(tf.constant(x) for x in batch)
            train = towerlib.build_train_graph(
                model, inputs, tf.compat.v1.train.GradientDescentOptimizer(0.1),
                devices=helpers.cpu_devices(2), accumulation_steps=k)
            with tf.compat.v1.Session(config=towerlib.session_config(2)) as session:
                session.run(tf.compat.v1.global_variables_initializer())
                losses = session.run([train.loss, train.regularization_loss])
                session.run(train.train_op)
                weights = [v for v in tf.compat.v1.global_variables()
                           if v.op.name == "fc/weights"][0]
                results[k] = losses + [session.run(weights)]
    for k in (2, 4):
        np.testing.assert_allclose(results[k][0], results[1][0], rtol=1e-6)
        np.testing.assert_allclose(results[k][1], results[1][1], rtol=1e-6)
        np.testing.assert_allclose(results[k][2], results[1][2], atol=1e-6)


def test_examples_per_step_counts_every_micro_batch():
    with tf.Graph().as_default():
        train = helpers.build_on_image_batch(2, batch_size=16, accumulation_steps=4,
                                             tower_fn=helpers.conv_dense_model)
        assert towerlib.run.loop_hooks.examples_per_step_of(train) == 16


@pytest.mark.parametrize("bn_mode", ["first_tower", "all_towers"])
def test_the_tower_functions_own_update_ops_run_once_per_step(bn_mode):
    def model(inputs, ctx):
        counter = tf.compat.v1.get_variable(
            "steps_seen", [], tf.int32, initializer=tf.compat.v1.zeros_initializer(),
            trainable=False)
        tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.UPDATE_OPS,
                                       counter.assign_add(1))
        return helpers.conv_dense_model(inputs, ctx)

    with tf.Graph().as_default():
        train = helpers.build_on_image_batch(1, tower_fn=model, batch_size=8,
                                             accumulation_steps=4, bn_mode=bn_mode)
        with tf.compat.v1.Session(config=towerlib.session_config(1)) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(train.train_op)
            counter = [v for v in tf.compat.v1.global_variables()
                       if v.op.name == "steps_seen"][0]
            assert session.run(counter) == 1


def test_all_towers_moving_statistics_are_numpys_pooled_update():
    """Batch norm on the images themselves: after one step the moving statistics
    are one update from the mean and variance of all 11 images, over 2
    micro-batches on 2 towers (shards 3, 3, 3, 2)."""
    def model(inputs, ctx):
        images, labels = inputs
        h = towerlib.batch_norm(images, ctx, name="bn_input", momentum=0.9)
        logits = layers.dense(layers.flatten(h), helpers.NUM_CLASSES, name="logits")
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=labels, logits=logits))

    images, labels = helpers.image_batch(11, seed=10, offset=3.0, scale=2.0)
    with tf.Graph().as_default():
        train = helpers.build_on_image_batch(
            2, tower_fn=model, inputs=(tf.constant(images), tf.constant(labels)),
            bn_mode="all_towers", accumulation_steps=2)
        with tf.compat.v1.Session(config=towerlib.session_config(2)) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(train.train_op)
            moving = {v.op.name: session.run(v) for v in tf.compat.v1.global_variables()
                      if v.op.name.startswith("bn_input/moving")}
    pixels = images.astype(np.float64).reshape(-1, images.shape[-1])
    np.testing.assert_allclose(moving["bn_input/moving_mean"], 0.1 * pixels.mean(axis=0),
                               rtol=1e-5)
    np.testing.assert_allclose(moving["bn_input/moving_variance"],
                               0.9 + 0.1 * pixels.var(axis=0), rtol=1e-5)


def test_run_training_names_a_run_time_batch_too_small_in_its_first_line(tmp_path):
    """3 examples, 2 towers, 2 micro-batches, size known at run time."""
    with tf.Graph().as_default():
        train = towerlib.build_train_graph(
            helpers.linear_classifier_tower, helpers.run_time_batches(3, 3),
            tf.compat.v1.train.GradientDescentOptimizer(0.1),
            devices=helpers.cpu_devices(2), accumulation_steps=2)
        with pytest.raises(towerlib.DataError) as raised:
            towerlib.run_training(train, train_dir=str(tmp_path), max_steps=1,
                                  session_config=towerlib.session_config(2),
                                  save_summaries_steps=None)
    first_line = str(raised.value).splitlines()[0]
    assert first_line == ("The global batch is smaller than accumulation_steps x towers (4); "
                          "some tower would get no example in some micro-batch "
                          "(the step did not run).")

"""Graph structure: one copy of each variable, placement, regularization once,
None gradients, EMA, summaries, the training loop (invariants 2-4)."""

import functools
import logging
import os

import numpy as np
import pytest
import tensorflow as tf

import towerlib
from tests import helpers
from towerlib import layers

# build(num_towers, ...): the conv+bn model on that many CPU towers, with momentum.
build = functools.partial(helpers.build_on_image_batch, optimizer_kind="momentum")


def variable_names_for(num_towers, bn_mode):
    with tf.Graph().as_default():
        build(num_towers, bn_mode=bn_mode)
        return sorted(v.op.name for v in tf.compat.v1.global_variables())


@pytest.mark.parametrize("bn_mode", ["first_tower", "all_towers"])
def test_variable_count_does_not_depend_on_tower_count(bn_mode):
    one = variable_names_for(1, bn_mode)
    assert one == variable_names_for(4, bn_mode)
    assert "conv1/weights" in one and "bn_conv1/moving_mean" in one


def test_towers_run_on_their_devices_and_variables_on_cpu0():
    with tf.Graph().as_default():
        train = build(3)
        for tower_loss, device in zip(train.tower_losses, helpers.cpu_devices(3)):
            assert tower_loss.device == device
        for var in tf.compat.v1.global_variables():
            assert var.device == "/device:CPU:0", var


def test_gpu_parameter_device_spreads_variables_by_size():
    with tf.Graph().as_default():
        big = lambda inputs, ctx: tf.reduce_mean(  # noqa: E731
            layers.dense(layers.dense(layers.flatten(inputs[0]), 64, name="a"),
                         64, name="b")) + tf.reduce_mean(
            layers.dense(layers.flatten(inputs[0]), 8, name="c"))
        build(3, tower_fn=big, update=towerlib.ParameterServer(device="gpu"))
        load = {}
        for var in tf.compat.v1.trainable_variables():
            load[var.device] = load.get(var.device, 0) + var.shape.num_elements() * 4
        assert len(load) == 3
        biggest = max(v.shape.num_elements() * 4 for v in tf.compat.v1.trainable_variables())
        assert max(load.values()) - min(load.values()) <= biggest


def test_global_step_counts_global_batches():
    _, train, step = helpers.run_towers(
        helpers.conv_dense_model, helpers.image_batch(8), "sgd", 4, steps=3)
    assert step == 3


def test_regularization_counted_once():
    with tf.Graph().as_default():
        train = build(4, tower_fn=helpers.conv_dense_model)
        weights = [v for v in tf.compat.v1.trainable_variables()
                   if v.op.name in ("conv1/weights", "fc1/weights")]
        with tf.compat.v1.Session(config=towerlib.session_config(4)) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            regularization, loss, total, values = session.run(
                [train.regularization_loss, train.loss, train.total_loss, weights])
    want = sum(1e-3 * np.sum(w.astype(np.float64) ** 2) / 2 for w in values)
    np.testing.assert_allclose(regularization, want, rtol=1e-5)
    np.testing.assert_allclose(total - loss, want, rtol=1e-4)


def test_loss_is_the_global_batch_mean_with_uneven_shards():
    """loss = mean over all examples, not the mean of the tower means."""
    batch = helpers.image_batch(10)

    def per_example_loss_model(inputs, ctx):
        images, _ = inputs
        return tf.reduce_mean(tf.reduce_sum(images, axis=[1, 2, 3]))

    with tf.Graph().as_default():
        train = towerlib.build_train_graph(
            lambda i, c: per_example_loss_model(i, c) + 0.0 * tf.reduce_sum(
                tf.compat.v1.get_variable("w", [1])),
            tuple(tf.constant(x) for x in batch),
            tf.compat.v1.train.GradientDescentOptimizer(0.1),
            devices=helpers.cpu_devices(4))
        with tf.compat.v1.Session(config=towerlib.session_config(4)) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            loss, shares = session.run([train.loss, train.tower_shares])
    np.testing.assert_allclose(shares, [0.3, 0.3, 0.2, 0.2], rtol=1e-6)
    np.testing.assert_allclose(loss, batch[0].sum(axis=(1, 2, 3)).mean(), rtol=1e-5)


def test_variable_without_gradient_is_skipped_with_a_warning(caplog):
    def with_unused_variable(inputs, ctx):
        tf.compat.v1.get_variable("unused", [3])
        return helpers.conv_dense_model(inputs, ctx)

    with tf.Graph().as_default(), caplog.at_level(logging.WARNING, logger="towerlib"):
        train = build(2, tower_fn=with_unused_variable)
        assert "Variable unused:0 has no gradient" in caplog.text
        assert all(v.op.name != "unused" for _, v in train.grads_and_vars)
        with tf.compat.v1.Session(config=towerlib.session_config(2)) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(train.train_op)
            assert session.run(train.global_step) == 1


def test_ema_tracks_weights_and_restores_into_the_model(tmp_path):
    decay = 0.5
    with tf.Graph().as_default():
        train = build(2, tower_fn=helpers.conv_dense_model, ema_decay=decay)
        kernel = [v for v in tf.compat.v1.trainable_variables()
                  if v.op.name == "fc1/weights"][0]
        shadow = train.ema.average(kernel)
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session(config=towerlib.session_config(2)) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            expected = session.run(kernel)
            for step in range(3):
                session.run(train.train_op)
                effective = min(decay, (1.0 + step + 1) / (10.0 + step + 1))
                expected = effective * expected + (1 - effective) * session.run(kernel)
            np.testing.assert_allclose(session.run(shadow), expected, rtol=1e-5, atol=1e-6)
            path = saver.save(session, os.path.join(tmp_path, "model"))
    with tf.Graph().as_default():
        ctx = towerlib.TowerContext.single(is_training=False)
        helpers.conv_dense_model(tuple(tf.constant(x) for x in helpers.image_batch(2)), ctx)
        tf.compat.v1.train.get_or_create_global_step()
        restorer = tf.compat.v1.train.Saver(towerlib.ema_restore_map(decay))
        kernel = [v for v in tf.compat.v1.trainable_variables()
                  if v.op.name == "fc1/weights"][0]
        with tf.compat.v1.Session() as session:
            restorer.restore(session, path)
            np.testing.assert_allclose(session.run(kernel), expected, rtol=1e-5, atol=1e-6)


def test_summaries_have_no_tower_prefix_and_merge_tower_scalars():
    batch = helpers.image_batch(10)

    def model_with_accuracy(inputs, ctx):
        images, _ = inputs
        towerlib.tower_scalar(ctx, "mean_pixel", tf.reduce_mean(images))
        return helpers.conv_dense_model(inputs, ctx)

    with tf.Graph().as_default():
        towerlib.build_train_graph(
            model_with_accuracy, tuple(tf.constant(x) for x in batch),
            tf.compat.v1.train.GradientDescentOptimizer(0.1),
            devices=helpers.cpu_devices(3), learning_rate=0.1)
        merged = tf.compat.v1.summary.merge_all()
        with tf.compat.v1.Session(config=towerlib.session_config(3)) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            summary = tf.compat.v1.Summary.FromString(session.run(merged))
    values = {v.tag: v.simple_value for v in summary.value}
    assert {"loss", "total_loss", "regularization_loss", "learning_rate",
            "mean_pixel"} <= set(values)
    assert not any(tag.startswith("tower_") for tag in values)
    np.testing.assert_allclose(values["mean_pixel"], batch[0].mean(), rtol=1e-5)
    assert towerlib.strip_tower_prefix("tower_12/xent/value") == "xent/value"


class CountSteps(tf.compat.v1.train.SessionRunHook):
    def __init__(self):
        self.steps_run = 0

    def after_run(self, run_context, run_values):
        self.steps_run += 1


def test_run_training_resumes_from_the_last_checkpoint(tmp_path):
    train_dir = str(tmp_path / "train")

    def train_until(max_steps):
        counter = CountSteps()
        with tf.Graph().as_default():
            train = build(2, tower_fn=helpers.conv_dense_model)
            step, loss = towerlib.run_training(
                train, train_dir=train_dir, max_steps=max_steps, hooks=[counter],
                session_config=towerlib.session_config(2), log_every_n_steps=1,
                examples_per_step=8)
        return step, loss, counter.steps_run

    step, loss, steps_run = train_until(3)
    assert (step, steps_run) == (3, 3) and np.isfinite(loss)
    assert tf.train.latest_checkpoint(train_dir).endswith("-3")
    step, _, steps_run = train_until(5)
    assert (step, steps_run) == (5, 2)  # continued from step 3, not from 0
    assert tf.train.latest_checkpoint(train_dir).endswith("-5")


def test_summary_tags_are_exact_even_when_op_names_collide():
    with tf.Graph().as_default():
        tf.constant(0.1, name="learning_rate")
        tf.constant(0.0, name="loss")
        build(2, tower_fn=helpers.conv_dense_model, learning_rate=0.1)
        with tf.compat.v1.Session(config=towerlib.session_config(2)) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            summary = tf.compat.v1.Summary.FromString(
                session.run(tf.compat.v1.summary.merge_all()))
    assert {"loss", "learning_rate"} <= {v.tag for v in summary.value}


@pytest.mark.parametrize("transport,deadlines", [("collective", [120]), ("graph", [])])
def test_run_training_bounds_each_step_only_when_sync_uses_collectives(
        tmp_path, monkeypatch, transport, deadlines):
    """run_training turns on the partial-fetch check and a step deadline for
    collectives; graph edges cannot wait for a missing tower and get none."""
    from towerlib.exchange import safety
    from towerlib.run import hooks

    seen_configs = []
    original = safety.bounded_session_config
    monkeypatch.setattr(safety, "bounded_session_config",
                        lambda config, seconds: seen_configs.append(seconds)
                        or original(config, seconds))
    fetch_checks = []

    class CountedFetchCheck(hooks.CollectiveFetchCheckHook):
        def __init__(self):
            super().__init__()
            fetch_checks.append(self)

    monkeypatch.setattr(hooks, "CollectiveFetchCheckHook", CountedFetchCheck)
    with tf.Graph().as_default():
        train = build(2, bn_mode="sync", exchange=transport)
        step, loss = towerlib.run_training(
            train, train_dir=str(tmp_path), max_steps=2,
            session_config=towerlib.session_config(2), collective_timeout_secs=120)
    assert step == 2 and np.isfinite(loss)
    assert seen_configs == deadlines
    assert len(fetch_checks) == len(deadlines)


def test_activity_regularization_in_the_tower_is_weighted_like_the_loss():
    """A term added inside the tower function counts once over the global batch,
    whatever the tower count (weights' regularizers count once anyway)."""
    batch = helpers.image_batch(10)

    def with_activity_penalty(inputs, ctx):
        images, _ = inputs
        tf.compat.v1.add_to_collection(
            tf.compat.v1.GraphKeys.REGULARIZATION_LOSSES,
            0.01 * tf.reduce_mean(tf.square(images)))
        return helpers.conv_dense_model(inputs, ctx)

    def regularization_for(num_towers):
        with tf.Graph().as_default():
            train = towerlib.build_train_graph(
                with_activity_penalty, tuple(tf.constant(x) for x in batch),
                tf.compat.v1.train.GradientDescentOptimizer(0.1),
                devices=helpers.cpu_devices(num_towers))
            kernels = [v for v in tf.compat.v1.trainable_variables()
                       if v.op.name in ("conv1/weights", "fc1/weights")]
            with tf.compat.v1.Session(config=towerlib.session_config(num_towers)) as session:
                session.run(tf.compat.v1.global_variables_initializer())
                return session.run([train.regularization_loss, kernels])

    one, kernels = regularization_for(1)
    weight_decay = sum(1e-3 * np.sum(k.astype(np.float64) ** 2) / 2 for k in kernels)
    np.testing.assert_allclose(one, 0.01 * np.mean(batch[0] ** 2) + weight_decay, rtol=1e-5)
    three, kernels = regularization_for(3)
    weight_decay = sum(1e-3 * np.sum(k.astype(np.float64) ** 2) / 2 for k in kernels)
    np.testing.assert_allclose(three, 0.01 * np.mean(batch[0] ** 2) + weight_decay, rtol=1e-5)


def test_seeded_dropout_draws_a_different_mask_per_tower():
    masks = []

    def model_with_dropout(inputs, ctx):
        images, _ = inputs
        masks.append(towerlib.layers.dropout(tf.ones([4, 50]), 0.5, ctx, seed=7))
        return helpers.conv_dense_model(inputs, ctx)

    with tf.Graph().as_default():
        tf.compat.v1.set_random_seed(1)
        build(2, tower_fn=model_with_dropout)
        with tf.compat.v1.Session(config=towerlib.session_config(2)) as session:
            first, second = session.run(masks)
    assert 0 < (first == 0).mean() < 1
    assert not np.array_equal(first, second)


@pytest.mark.parametrize("update", ["parameter_server", "replicated"])
def test_builds_inside_a_scope_with_its_own_custom_getter(update):
    """A user's enclosing custom getter still sees every variable request."""
    seen = []

    def recording_getter(getter, name, *args, **kwargs):
        seen.append(name)
        return getter(name, *args, **kwargs)

    with tf.Graph().as_default():
        with tf.compat.v1.variable_scope("model", custom_getter=recording_getter):
            build(2, update=update)
    assert "model/conv1/weights" in seen

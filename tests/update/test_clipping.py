"""ClipByGlobalNorm: N towers clip the whole global batch's gradient as one device's
tf.clip_by_global_norm does, every copy alike; per-tower clipping would not."""

import warnings

import numpy as np
import pytest
import tensorflow as tf

import towerlib
from tests import half_precision, helpers

CLIP = 0.05  # below the models' gradient norms: clipping is active every step
STEPS = 4


def _reference(model_fn, batch, steps=STEPS, clip=CLIP, shards=None):
    """One device, plain TF 1: tf.clip_by_global_norm on the dense gradient, then Momentum.

    shards: None for the whole batch; else [(start, end)]: each shard's gradient of its own
    mean loss clipped alone, the results averaged (what per-tower clipping does), SGD.
    """
    with tf.Graph().as_default():
        ctx = towerlib.TowerContext.single(is_training=True)
        images, labels = (tf.constant(x) for x in batch)
        parts = [(0, len(batch[1]))] if shards is None else shards
        clipped_parts, norms = [], []
        for index, (start, end) in enumerate(parts):
            with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope(),
                                             reuse=index > 0):
                loss = model_fn((images[start:end], labels[start:end]), ctx)
            regularization = tf.compat.v1.losses.get_regularization_losses()
            total = loss + (tf.add_n(regularization) if regularization else 0.0)
            variables = tf.compat.v1.trainable_variables()
            gradients = [tf.convert_to_tensor(g) for g in tf.gradients(total, variables)]
            clipped, norm = tf.clip_by_global_norm(gradients, clip)
            clipped_parts.append(clipped)
            norms.append(norm)
        averaged = [tf.add_n(list(gs)) / len(parts) for gs in zip(*clipped_parts)]
        optimizer = (helpers.make_optimizer("momentum") if shards is None
                     else helpers.make_optimizer("sgd"))
        with tf.control_dependencies(
                tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)):
            train_op = optimizer.apply_gradients(list(zip(averaged, variables)))
        model = helpers.model_variables()
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            helpers.load_values(session, model, helpers.initial_values_for(model))
            first_norm = session.run(norms[0])
            for _ in range(steps):
                session.run(train_op)
            return {v.op.name: session.run(v) for v in model}, first_norm


def _towers(model_fn, batch, num_towers, steps=STEPS, optimizer="momentum", **options):
    """towerlib with clipping; (weights, the first step's norm, every copy's values)."""
    with tf.Graph().as_default():
        train = towerlib.build_train_graph(
            model_fn, tuple(tf.constant(x) for x in batch), helpers.make_optimizer(optimizer),
            devices=helpers.cpu_devices(num_towers),
            clipping=towerlib.ClipByGlobalNorm(CLIP), **options)
        model = helpers.model_variables()
        copies = [v for v in tf.compat.v1.local_variables()
                  if v.op.name.startswith("replicated/")]
        with tf.compat.v1.Session(config=towerlib.session_config(num_towers)) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            helpers.load_values(session, model, helpers.initial_values_for(model))
            session.run(tf.compat.v1.local_variables_initializer())  # copies <- tower 0's
            first_norm = None
            for _ in range(steps):
                _, norm = session.run([train.train_op, train.gradient_norm])
                first_norm = norm if first_norm is None else first_norm
            tower_0 = {v.op.name: session.run(v) for v in tf.compat.v1.global_variables()}
            return ({v.op.name: session.run(v) for v in model}, first_norm,
                    {v.op.name: (session.run(v), tower_0[v.op.name.split("/", 2)[2]])
                     for v in copies})


def _assert_copies_equal(weights, copies):
    """Every tower's copy (weights and slots) bit-identical to tower 0's."""
    del weights
    for name, (value, tower_0) in copies.items():
        np.testing.assert_array_equal(value, tower_0, err_msg=name)


UPDATES = {"ps": towerlib.ParameterServer, "replicated": towerlib.Replicated}


@pytest.mark.parametrize("update", sorted(UPDATES))
@pytest.mark.parametrize("num_towers", [2, 4])
def test_towers_clip_as_one_device_clips_the_whole_batch(update, num_towers):
    batch = helpers.image_batch(10)  # uneven over 4 towers
    want, want_norm = _reference(helpers.conv_bn_model, batch)
    got, got_norm, copies = _towers(helpers.conv_bn_model, batch, num_towers,
                                    bn_mode="sync", update=UPDATES[update]())
    assert got_norm > CLIP and got_norm == pytest.approx(want_norm, rel=1e-5)
    assert helpers.max_abs_difference(got, want) < 1e-5
    _assert_copies_equal(got, copies)


@pytest.mark.parametrize("update", sorted(UPDATES))
def test_sparse_gradients_clip_by_their_dense_norm(update):
    batch = helpers.id_batch(9)  # repeated ids: rows of one index are summed first
    want, want_norm = _reference(helpers.embedding_model, batch)
    got, got_norm, copies = _towers(helpers.embedding_model, batch, 2,
                                    update=UPDATES[update]())
    assert got_norm == pytest.approx(want_norm, rel=1e-5)
    assert helpers.max_abs_difference(got, want) < 1e-5
    _assert_copies_equal(got, copies)


@pytest.mark.parametrize("update", sorted(UPDATES))
def test_accumulated_micro_batches_clip_the_steps_total(update):
    batch = helpers.image_batch(12)
    want, _ = _reference(helpers.conv_dense_model, batch)
    got, _, copies = _towers(helpers.conv_dense_model, batch, 2, accumulation_steps=2,
                             update=UPDATES[update]())
    assert helpers.max_abs_difference(got, want) < 1e-5
    _assert_copies_equal(got, copies)


@pytest.mark.half_precision
def test_float16_clips_after_unscaling():
    """Clipped before unscaling, the factor would be ~32768 times too small.

    float16 against float32: each gradient within 16 u (u = 2**-11) of its size, so its
    global norm within 16 u = 7.8e-3 relative, and the weights within 16 u of how far
    float32 moved them over the steps (tests/half_precision.py)."""
    batch = helpers.image_batch(8)
    want, want_norm = _reference(helpers.conv_dense_model, batch)
    got, got_norm, _ = _towers(helpers.conv_dense_model, batch, 2,
                               precision=towerlib.Float16(loss_scale=1024.0))
    rtol = half_precision.PATH_ROUNDINGS * half_precision.unit_roundoff("float16")
    assert got_norm == pytest.approx(want_norm, rel=rtol)
    moved = half_precision.motion(want, helpers.initial_values_like(want))
    assert helpers.max_abs_difference(got, want) <= half_precision.trained_atol(
        "float16", moved)


def test_per_tower_clipping_is_not_what_towerlib_does():
    """Clipping each tower's gradient and averaging takes another step on 2 towers."""
    batch = helpers.image_batch(10)
    per_tower, _ = _reference(helpers.conv_dense_model, batch, steps=1,
                              shards=[(0, 5), (5, 10)])
    global_clip, _ = _reference(helpers.conv_dense_model, batch, steps=1, shards=[(0, 10)])
    got, _, _ = _towers(helpers.conv_dense_model, batch, 2, steps=1, optimizer="sgd")
    assert helpers.max_abs_difference(got, global_clip) < 1e-6
    assert helpers.max_abs_difference(got, per_tower) > 1e-5  # 1.5e-4 when measured


@pytest.mark.parametrize("value", [0, -1.0, float("inf"), float("nan"), "5", True])
def test_a_bad_clip_norm_is_one_line(value):
    with pytest.raises(ValueError, match=r"ClipByGlobalNorm\(clip_norm=.*Fix: a finite"):
        towerlib.ClipByGlobalNorm(value)


def test_a_class_or_a_number_for_clipping_is_refused_naming_the_object():
    with tf.Graph().as_default():
        for given, text in ((towerlib.ClipByGlobalNorm, "is the class"), (5.0, "got 5.0")):
            with pytest.raises(TypeError, match=text):
                helpers.build_on_image_batch(2, clipping=given)


def test_a_clip_norm_below_the_floor_warns_and_one_above_does_not():
    from towerlib.update.clipping import CLIP_NORM_FLOOR
    with pytest.warns(UserWarning, match=r"clip_norm=1e-30\) is below 1e-06.*may never move"):
        towerlib.ClipByGlobalNorm(1e-30)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        towerlib.ClipByGlobalNorm(CLIP_NORM_FLOOR)
        towerlib.ClipByGlobalNorm(5.0)

"""compute_dtype and loss scaling through build_train_graph and run_training."""

import logging

import numpy as np
import pytest
import tensorflow as tf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import towerlib
from tests import half_precision, helpers
from towerlib import layers

GRADIENT_FACTOR = "gradient_factor"


def _scaled_gradient(x, factor):
    """Identity forward; the backward multiplies by `factor` (inf injects an overflow)."""

    @tf.custom_gradient
    def identity(value):
        return tf.identity(value), lambda upstream: upstream * tf.cast(factor, upstream.dtype)

    return identity(x)


def model_with_overflow_switch(inputs, ctx):
    images, labels = inputs
    factor = tf.compat.v1.get_default_graph().get_tensor_by_name(GRADIENT_FACTOR + ":0")
    h = layers.conv2d(images, 4, 3, name="conv1", use_bias=False)
    h = tf.nn.relu(towerlib.batch_norm(h, ctx, name="bn1"))
    h = _scaled_gradient(layers.flatten(h), factor)
    logits = tf.cast(layers.dense(h, helpers.NUM_CLASSES, name="logits"), tf.float32)
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=labels, logits=logits))


def _state(session, train):
    """Everything a skipped step must leave alone, by name (the scale apart)."""
    return {v.op.name: session.run(v) for v in tf.compat.v1.global_variables()
            if not v.op.name.startswith("loss_scale/")}


def _build(compute_dtype, optimizer=None, **options):
    """The float16 scale starts where float16 holds this model's gradients, and
    the graph is seeded: only the injected overflow may skip a step."""
    tf.compat.v1.set_random_seed(2)
    if compute_dtype == "float16":
        compute_dtype = towerlib.Float16(loss_scale=options.pop(
            "loss_scale", towerlib.loss_scaling.DynamicLossScale(initial=1024.0)))
    tf.compat.v1.placeholder_with_default(1.0, [], name=GRADIENT_FACTOR)
    inputs = tuple(tf.constant(x) for x in helpers.image_batch(8, seed=3))
    return towerlib.build_train_graph(
        model_with_overflow_switch, inputs,
        optimizer or tf.compat.v1.train.MomentumOptimizer(0.05, 0.9),
        devices=helpers.cpu_devices(2), precision=compute_dtype, **options)


def test_float16_overflow_skips_the_step_and_halves_the_scale():
    with tf.Graph().as_default():
        train = _build("float16", ema_decay=0.9, bn_mode="all_towers")
        factor = tf.compat.v1.get_default_graph().get_tensor_by_name(GRADIENT_FACTOR + ":0")
        scale = train.loss_scale.value
        with tf.compat.v1.Session(config=towerlib.session_config(2)) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(train.train_op)
            before, scale_before = _state(session, train), session.run(scale)
            session.run(train.train_op, {factor: np.inf})  # the gradients overflow
            after = _state(session, train)
            assert session.run(scale) == scale_before / 2
            for name, value in before.items():
                np.testing.assert_array_equal(after[name], value, err_msg=name)
            assert after["global_step"] == 1
            assert any(name.endswith("moving_mean") for name in after)
            assert any("ExponentialMovingAverage" in name for name in after)
            session.run(train.train_op)  # and training goes on
            assert session.run(train.global_step) == 2
            assert not np.array_equal(session.run("conv1/weights:0"), after["conv1/weights"])


@pytest.mark.half_precision
def test_float16_variables_stay_float32_and_train_like_float32():
    """5 Momentum steps in each half dtype end within 16 u of how far float32 moved
    the weights (tests/half_precision.py; the weights move by 0.35: float16 2.7e-3,
    bfloat16 2.2e-2; measured 5.0e-4 and 4.1e-3 under both oneDNN settings)."""
    results = {}
    for compute_dtype in ("float32", "float16", "bfloat16"):
        with tf.Graph().as_default():
            train = _build(compute_dtype)
            assert all(v.dtype.base_dtype == tf.float32
                       for v in tf.compat.v1.global_variables()
                       if v.dtype.base_dtype.is_floating)
            assert train.loss.dtype == tf.float32
            with tf.compat.v1.Session(config=towerlib.session_config(2)) as session:
                session.run(tf.compat.v1.global_variables_initializer())
                weights = [v for v in helpers.model_variables()
                           if not v.op.name.startswith("loss_scale/")]
                initial = helpers.initial_values_for(weights)
                helpers.load_values(session, weights, initial)
                for _ in range(5):
                    session.run(train.train_op)
                results[compute_dtype] = {v.op.name: session.run(v) for v in weights}
    moved = half_precision.motion(results["float32"], initial)
    for compute_dtype in ("float16", "bfloat16"):
        tolerance = half_precision.trained_atol(compute_dtype, moved)
        for name, value in results["float32"].items():
            np.testing.assert_allclose(results[compute_dtype][name], value, atol=tolerance,
                                       err_msg=f"{compute_dtype} {name}")


def test_the_scale_survives_a_checkpoint_and_resume(tmp_path):
    def train_to(max_steps, inject):
        with tf.Graph().as_default():
            train = _build("float16", loss_scale=towerlib.precision.loss_scaling.DynamicLossScale(
                initial=1024.0, growth_interval=1000))
            hooks = []
            if inject:
                factor = tf.compat.v1.get_default_graph().get_tensor_by_name(
                    GRADIENT_FACTOR + ":0")

                class OverflowOnce(tf.compat.v1.train.SessionRunHook):
                    done = False

                    def before_run(self, run_context):
                        if not self.done:
                            self.done = True
                            return tf.compat.v1.train.SessionRunArgs(
                                None, feed_dict={factor: np.inf})
                        return None

                hooks.append(OverflowOnce())
            towerlib.run_training(train, train_dir=str(tmp_path), max_steps=max_steps,
                                  hooks=hooks, session_config=towerlib.session_config(2),
                                  save_summaries_steps=None)
        reader = tf.train.load_checkpoint(towerlib.find_restorable_checkpoint(str(tmp_path)))
        return reader.get_tensor("loss_scale/scale"), reader.get_tensor("global_step")

    scale, step = train_to(2, inject=True)
    assert (scale, step) == (512.0, 2)  # one skipped run, two applied
    scale, step = train_to(4, inject=False)
    assert (scale, step) == (512.0, 4)  # resumed with the saved scale


def test_skipped_steps_and_the_scale_are_logged_and_summarized(tmp_path, caplog):
    """A skipped float16 step says so, every line names the
    scale, TensorBoard gets loss_scale, global_step/sec and a point at the last step."""
    with tf.Graph().as_default():
        train = _build("float16")
        factor = tf.compat.v1.get_default_graph().get_tensor_by_name(GRADIENT_FACTOR + ":0")

        class OverflowAtThirdRun(tf.compat.v1.train.SessionRunHook):
            runs = 0

            def before_run(self, run_context):
                self.runs += 1
                if self.runs == 3:
                    return tf.compat.v1.train.SessionRunArgs(None, feed_dict={factor: np.inf})
                return None

        with caplog.at_level(logging.INFO, logger="towerlib"):
            towerlib.run_training(train, train_dir=str(tmp_path), max_steps=5,
                                  hooks=[OverflowAtThirdRun()], log_every_n_steps=1,
                                  save_summaries_steps=2,
                                  session_config=towerlib.session_config(2))
    assert "step 3 skipped: float16 gradients overflowed at loss scale 1024" in caplog.text
    logged = [line for line in caplog.text.splitlines() if ", loss = " in line]
    assert [line.split("step ")[1].split(",")[0] for line in logged] == ["1", "2", "3", "4", "5"]
    assert all("loss scale" in line for line in logged)
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert {"loss_scale", "global_step/sec"} <= set(events.Tags()["scalars"])
    assert [e.step for e in events.Scalars("loss")] == [1, 2, 4, 5]


def test_a_real_nan_loss_under_loss_scaling_is_still_a_non_finite_error(tmp_path):
    def nan_model(inputs, ctx):
        return model_with_overflow_switch(inputs, ctx) * np.float32(np.nan)

    for guard in (False, True):
        with tf.Graph().as_default():
            tf.compat.v1.placeholder_with_default(1.0, [], name=GRADIENT_FACTOR)
            optimizer = tf.compat.v1.train.MomentumOptimizer(0.05, 0.9)
            inputs = tuple(tf.constant(x) for x in helpers.image_batch(8, seed=3))
            train = towerlib.build_train_graph(
                nan_model, inputs, towerlib.guard_numerics(optimizer) if guard else optimizer,
                devices=helpers.cpu_devices(2), precision="float16")
            with pytest.raises(towerlib.NonFiniteError):
                towerlib.run_training(train, train_dir=str(tmp_path / str(guard)),
                                      max_steps=3, session_config=towerlib.session_config(2),
                                      save_summaries_steps=None)


@pytest.mark.parametrize("options,match", [
    (dict(precision="float64"), "compute_dtype"),
    (dict(precision="float16", guard_gradients=True), "check_gradients=True"),
])
def test_bad_mixed_precision_options_are_refused(options, match):
    optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.1)
    if options.pop("guard_gradients", False):
        optimizer = towerlib.guard_numerics(optimizer, check_gradients=True)
    with tf.Graph().as_default():
        inputs = tuple(tf.constant(x) for x in helpers.image_batch(8))
        with pytest.raises(ValueError, match=match):
            towerlib.build_train_graph(helpers.conv_dense_model, inputs, optimizer,
                                       devices=helpers.cpu_devices(2), **options)


@pytest.mark.parametrize("in_compute_dtype", [False, True])
def test_replicated_bfloat16_all_reduce_in_either_dtype(in_compute_dtype):
    with tf.Graph().as_default():
        train = _build("bfloat16", update=towerlib.Replicated(
            wire_dtype="bfloat16" if in_compute_dtype else None))
        graph = tf.compat.v1.get_default_graph()
        hubs = [op for op in graph.get_operations()
                if op.type == "AddN" and "cross_tower_exchange" in op.name]
        assert hubs and {op.outputs[0].dtype for op in hubs} == {
            tf.bfloat16 if in_compute_dtype else tf.float32}
        with tf.compat.v1.Session(config=towerlib.session_config(2)) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(tf.compat.v1.local_variables_initializer())
            for _ in range(3):
                session.run(train.train_op)
            copies = {name: session.run(variables)
                      for name, variables in train.variable_copies.items()}
        assert all(g.dtype == tf.float32 for g, _ in train.grads_and_vars)
        for name, (first, second) in copies.items():
            np.testing.assert_array_equal(first, second, err_msg=name)


@pytest.mark.parametrize("loss_scale", [-1, 0, float("inf"), float("nan"), "dynamc", True])
def test_float16_names_a_bad_loss_scale_and_the_fix(loss_scale):
    """The error names loss_scale, not just 'value'."""
    with pytest.raises(ValueError, match=r"Float16\(loss_scale=.*loss scale.*Fix: "):
        towerlib.Float16(loss_scale=loss_scale)


def test_precision_names_are_shorthands_for_the_objects():
    from towerlib.precision import resolve_precision
    assert resolve_precision("float16") == towerlib.Float16(loss_scale="dynamic")
    assert resolve_precision(tf.bfloat16) == towerlib.BFloat16()
    assert resolve_precision("float32") == towerlib.Float32()
    with pytest.raises(ValueError, match="compute_dtype must be one of"):
        resolve_precision("half")


@pytest.mark.parametrize("alias", ["half", "float", np.float16])
def test_compute_dtype_takes_the_names_not_aliases(alias):
    with pytest.raises(ValueError, match="compute_dtype must be one of"):
        towerlib.precision.casting.check_compute_dtype(alias)
    assert towerlib.precision.casting.check_compute_dtype(tf.float16) == tf.float16

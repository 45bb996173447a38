"""Loss scaling (towerlib.precision.loss_scaling): skipped overflow steps, the scale's rise and fall,
checkpoints, the floor error, exact unscaling, Momentum, Adam and the NaN guard."""

import numpy as np
import pytest
import tensorflow as tf

import towerlib
from towerlib.precision import loss_scaling
from towerlib.run import hooks


class _Step:
    """w [3] (dense) and table [5, 2] (sparse gradient), one loss-scaled update.

    The placeholder `factor` multiplies the dense gradient after the backward
    pass: 1.0 for a good step, inf to inject an overflow.
    """

    def __init__(self, loss_scale, optimizer, loss_factor=None):
        self.global_step = tf.compat.v1.train.get_or_create_global_step()
        self.w = tf.compat.v1.get_variable("w", initializer=[1.0, -2.0, 0.5])
        self.table = tf.compat.v1.get_variable(
            "table", initializer=np.arange(10, dtype=np.float32).reshape(5, 2) / 10)
        self.factor = tf.compat.v1.placeholder_with_default(1.0, [], name="factor")
        self.loss_factor = tf.compat.v1.placeholder_with_default(1.0, [], name="loss_factor")
        rows = tf.nn.embedding_lookup(self.table, [0, 3, 3])
        self.loss = (tf.reduce_sum(self.w * self.w) + tf.reduce_sum(rows)) * self.loss_factor
        self.loss_scale = loss_scale
        pairs = optimizer.compute_gradients(loss_scale.scale(self.loss))
        pairs = [(g * self.factor if v is self.w else g, v) for g, v in pairs]
        self.pairs = loss_scale.unscale(pairs)
        finite = loss_scale.all_finite([g for g, _ in self.pairs])
        self.train_op = loss_scale.apply_or_skip(
            finite, lambda: optimizer.apply_gradients(self.pairs, global_step=self.global_step),
            loss_is_finite=tf.math.is_finite(self.loss))

    def run(self, session, overflow=False):
        session.run(self.train_op, {self.factor: np.inf if overflow else 1.0})

    def state(self, session):
        """Every global variable's value (weights, slots, global_step, the scale)."""
        return session.run({v.op.name: v for v in tf.compat.v1.global_variables()})


def _session():
    session = tf.compat.v1.Session()
    session.run([tf.compat.v1.global_variables_initializer(),
                 tf.compat.v1.local_variables_initializer()])
    return session


def _assert_unchanged(before, after, names):
    for name in names:
        np.testing.assert_array_equal(after[name], before[name], err_msg=name)


@pytest.mark.parametrize("kind", ["momentum", "adam"])
def test_overflow_is_skipped_then_the_scale_halves_and_grows_back(kind):
    optimizer = (tf.compat.v1.train.MomentumOptimizer(0.1, 0.9) if kind == "momentum"
                 else tf.compat.v1.train.AdamOptimizer(0.1))
    with tf.Graph().as_default():
        step = _Step(loss_scaling.DynamicLossScale(initial=2.0 ** 10, growth_interval=3),
                     optimizer)
        with _session() as session:
            state = step.state(session)
            slots = [n for n in state if n.endswith(("Momentum", "Adam", "Adam_1", "_power"))]
            # Slots (and Adam's beta powers) exist and were initialized outside the cond.
            assert len(slots) == (2 if kind == "momentum" else 6), sorted(state)
            step.run(session)
            before = step.state(session)
            assert before["global_step"] == 1 and before["loss_scale/good_steps"] == 1

            step.run(session, overflow=True)
            after = step.state(session)
            _assert_unchanged(before, after, ["w", "table", "global_step"] + slots)
            assert after["loss_scale/scale"] == 2.0 ** 9
            assert after["loss_scale/good_steps"] == 0

            for good_steps in (1, 2):
                step.run(session)
                state = step.state(session)
                assert (state["loss_scale/scale"], state["loss_scale/good_steps"]) == (
                    2.0 ** 9, good_steps)
            step.run(session)  # the third good step in a row
            state = step.state(session)
            assert (state["loss_scale/scale"], state["loss_scale/good_steps"]) == (2.0 ** 10, 0)
            assert state["global_step"] == 4  # the skipped step did not count
            assert not np.array_equal(state["w"], after["w"])


def test_scale_variables_are_saved_and_restored(tmp_path):
    prefix = str(tmp_path / "model.ckpt")
    with tf.Graph().as_default():
        step = _Step(loss_scaling.DynamicLossScale(initial=8.0, growth_interval=5),
                     tf.compat.v1.train.GradientDescentOptimizer(0.1))
        saver = tf.compat.v1.train.Saver()
        assert {v.op.name for v in step.loss_scale.variables} == {
            "loss_scale/scale", "loss_scale/good_steps"}
        assert not set(step.loss_scale.variables) & set(tf.compat.v1.trainable_variables())
        with _session() as session:
            step.run(session, overflow=True)
            step.run(session)
            step.run(session)
            saved = step.state(session)
            saver.save(session, prefix)
    assert (saved["loss_scale/scale"], saved["loss_scale/good_steps"]) == (4.0, 2)
    names = {name for name, _ in tf.train.list_variables(prefix)}
    assert {"loss_scale/scale", "loss_scale/good_steps"} <= names
    with tf.Graph().as_default():
        step = _Step(loss_scaling.DynamicLossScale(initial=8.0, growth_interval=5),
                     tf.compat.v1.train.GradientDescentOptimizer(0.1))
        with tf.compat.v1.Session() as session:
            tf.compat.v1.train.Saver().restore(session, prefix)
            restored = step.state(session)
    assert (restored["loss_scale/scale"], restored["loss_scale/good_steps"]) == (4.0, 2)


def test_fixed_scale_skips_an_overflow_and_keeps_its_value():
    with tf.Graph().as_default():
        step = _Step(loss_scaling.FixedLossScale(128.0),
                     tf.compat.v1.train.MomentumOptimizer(0.1, 0.9))
        assert step.loss_scale.variables == ()
        with _session() as session:
            step.run(session)
            before = step.state(session)
            skipped = session.run(
                [step.train_op, step.loss_scale.applied, step.loss_scale.floor_reached,
                 step.loss_scale.value], {step.factor: np.inf})[1:]
            after = step.state(session)
            applied = session.run([step.train_op, step.loss_scale.applied,
                                   step.loss_scale.floor_reached])[1:]
    _assert_unchanged(before, after, list(before))
    assert skipped == [False, True, 128.0]  # every overflow is at a fixed scale's floor
    assert applied == [True, False]
    assert after["global_step"] == 1


def test_floor_hook_raises_when_the_floor_still_overflows():
    with tf.Graph().as_default():
        step = _Step(loss_scaling.DynamicLossScale(initial=4.0, floor=2.0),
                     tf.compat.v1.train.GradientDescentOptimizer(0.1))
        hook = hooks.LossScaleFloorHook(step.loss_scale)
        with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as session:
            session.run(step.train_op)                       # good: step 1
            session.run(step.train_op, {step.factor: np.inf})  # 4 -> 2, not yet at the floor
            with pytest.raises(loss_scaling.LossScaleFloorError) as raised:
                session.run(step.train_op, {step.factor: np.inf})  # at the floor 2
    error = raised.value
    assert (error.step, error.scale, error.overflows_in_a_row) == (2, 2.0, 1)
    message = str(error)
    assert "could not avoid an overflow at step 2" in message
    assert "loss scale at its lowest, 2" in message
    assert "a NaN loss is a NonFiniteError" in message
    assert "bfloat16" in message and "lower the learning rate" in message


def test_floor_hook_tolerates_overflows_in_a_row_below_its_limit():
    with tf.Graph().as_default():
        step = _Step(loss_scaling.FixedLossScale(4.0),
                     tf.compat.v1.train.GradientDescentOptimizer(0.1))
        hook = hooks.LossScaleFloorHook(step.loss_scale, overflows_in_a_row=2)
        with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as session:
            session.run(step.train_op, {step.factor: np.inf})
            session.run(step.train_op)   # a good step resets the count
            session.run(step.train_op, {step.factor: np.inf})
            with pytest.raises(loss_scaling.LossScaleFloorError, match="in 2 step"):
                session.run(step.train_op, {step.factor: np.inf})


@pytest.mark.parametrize("loss_scale", [lambda: loss_scaling.FixedLossScale(1000.0),
                                        lambda: loss_scaling.DynamicLossScale()])
def test_scaled_then_unscaled_gradients_equal_the_plain_ones(loss_scale):
    with tf.Graph().as_default():
        scale = loss_scale()
        w = tf.compat.v1.get_variable("w", initializer=np.linspace(-3, 3, 7, dtype=np.float32))
        table = tf.compat.v1.get_variable("table", initializer=np.ones([4, 3], np.float32))
        loss = (tf.reduce_sum(tf.sin(w) * w) +
                tf.reduce_sum(tf.nn.embedding_lookup(table, [1, 2, 2]) ** 2) * 0.37)
        optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.1)
        plain = optimizer.compute_gradients(loss)
        unscaled = scale.unscale(optimizer.compute_gradients(scale.scale(loss)))
        assert isinstance(unscaled[1][0], tf.IndexedSlices)
        with _session() as session:
            plain_values, unscaled_values = session.run(
                [[g for g, _ in plain], [g for g, _ in unscaled]])
    for expected, actual in zip(plain_values, unscaled_values):
        if hasattr(expected, "indices"):  # IndexedSlicesValue
            np.testing.assert_array_equal(actual.indices, expected.indices)
            expected, actual = expected.values, actual.values
        np.testing.assert_allclose(actual, expected, rtol=1e-6)


def test_a_nan_loss_is_the_guards_error_not_an_overflow():
    """With guard_numerics the NaN loss fails the step; the scale does not move."""
    with tf.Graph().as_default():
        guarded = towerlib.guard_numerics(tf.compat.v1.train.MomentumOptimizer(0.1, 0.9))
        step = _Step(loss_scaling.DynamicLossScale(initial=16.0), guarded)
        with _session() as session:
            step.run(session)
            before = step.state(session)
            with pytest.raises(tf.errors.InvalidArgumentError) as raised:
                session.run(step.train_op, {step.loss_factor: np.nan})
            assert guarded.is_guard_error(raised.value)
            assert "the loss is NaN or Inf" in str(guarded.failure(session))
            after = step.state(session)
            _assert_unchanged(before, after, list(before))  # scale 16, count 1 kept
            step.run(session, overflow=True)                # an overflow is still skipped
            assert session.run(step.loss_scale.scale_variable) == 8.0
            assert session.run(step.global_step) == 1


def test_make_loss_scale_and_bad_arguments():
    with tf.Graph().as_default():
        assert loss_scaling.make_loss_scale(None) is None
        assert isinstance(loss_scaling.make_loss_scale("dynamic"), loss_scaling.DynamicLossScale)
        assert isinstance(loss_scaling.make_loss_scale(256), loss_scaling.FixedLossScale)
        custom = loss_scaling.DynamicLossScale(initial=64.0, name="custom")
        assert loss_scaling.make_loss_scale(custom) is custom
        assert custom.scale_variable.op.name == "custom/scale"
        with pytest.raises(ValueError, match="Fix: 'dynamic' with precision='float16'"):
            loss_scaling.make_loss_scale("dynamc")
        for bad in [dict(initial=0), dict(factor=1.0), dict(floor=4.0, initial=2.0),
                    dict(growth_interval=0), dict(initial=float("inf"))]:
            with pytest.raises(ValueError):
                loss_scaling.DynamicLossScale(**bad)
        with pytest.raises(RuntimeError, match="Call apply_or_skip first"):
            _ = custom.floor_reached
    with tf.Graph().as_default(), pytest.raises(ValueError, match="another graph"):
        loss_scaling.make_loss_scale(custom)


def test_float16_towers_with_loss_scaling_as_build_train_graph_would_wire_them():
    """Two towers on virtual CPUs: compute_in + scale/unscale/apply_or_skip around
    the steps build_train_graph takes today (a preview of the wiring)."""
    from tests import helpers
    from towerlib.precision import casting as mixed_precision

    with tf.Graph().as_default():
        # Seeded, and a scale that leaves float16 room: an overflow would skip
        # a step and make the counts below depend on the draw.
        tf.compat.v1.set_random_seed(1)
        global_step = tf.compat.v1.train.get_or_create_global_step()
        with tf.device("/device:CPU:0"):
            loss_scale = loss_scaling.make_loss_scale(
                loss_scaling.DynamicLossScale(initial=256.0))
        model = mixed_precision.compute_in(helpers.conv_bn_model, "float16")
        inputs = tuple(tf.constant(x) for x in helpers.image_batch(8))
        towers, _ = towerlib.build_towers(model, inputs, devices=helpers.cpu_devices(2))
        optimizer = tf.compat.v1.train.MomentumOptimizer(0.1, 0.9)
        tower_pairs = []
        for tower in towers:
            with tf.device(tower.context.device):
                objective = loss_scale.scale(0.5 * tower.loss)
                tower_pairs.append(optimizer.compute_gradients(
                    objective, colocate_gradients_with_ops=True))
        pairs = loss_scale.unscale(towerlib.aggregate_gradients(tower_pairs))
        loss = tf.add_n([0.5 * t.loss for t in towers])
        train_op = loss_scale.apply_or_skip(
            loss_scale.all_finite([g for g, _ in pairs]),
            lambda: optimizer.apply_gradients(pairs, global_step=global_step),
            loss_is_finite=tf.math.is_finite(loss))
        assert {v.dtype.base_dtype for v in tf.compat.v1.global_variables()
                if v is not global_step and "good_steps" not in v.op.name} == {tf.float32}
        assert {g.dtype for g, _ in pairs} == {tf.float32}
        with tf.compat.v1.Session(config=towerlib.session_config(2)) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            losses = [session.run([train_op, loss])[1] for _ in range(4)]
            assert session.run(global_step) == 4
            assert session.run(loss_scale.value) == 256.0
    assert losses[-1] < losses[0], losses


def test_updates_inside_the_cond_run_on_their_variables_devices():
    with tf.Graph().as_default():
        global_step = tf.compat.v1.train.get_or_create_global_step()
        weights = []
        for index in range(2):
            with tf.device(f"/device:CPU:{index}"):
                weights.append(tf.compat.v1.get_variable(f"w{index}", initializer=[1.0, 2.0]))
        loss_scale = loss_scaling.DynamicLossScale()
        optimizer = tf.compat.v1.train.MomentumOptimizer(0.1, 0.9)
        pairs = loss_scale.unscale(optimizer.compute_gradients(
            loss_scale.scale(tf.reduce_sum(weights[0] * weights[1]))))
        train_op = loss_scale.apply_or_skip(
            loss_scale.all_finite([g for g, _ in pairs]),
            lambda: optimizer.apply_gradients(pairs, global_step=global_step))
        with tf.compat.v1.Session(config=towerlib.session_config(2)) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            metadata = tf.compat.v1.RunMetadata()
            session.run(train_op, options=tf.compat.v1.RunOptions(
                trace_level=tf.compat.v1.RunOptions.FULL_TRACE), run_metadata=metadata)
    placed = {node.node_name: stats.device for stats in metadata.step_stats.dev_stats
              for node in stats.node_stats if node.node_name.endswith("ResourceApplyMomentum")}
    assert len(placed) == 2, placed  # the cond's branch, inlined: '.../then/...'
    for index in range(2):
        device = next(d for n, d in placed.items() if f"update_w{index}/" in n)
        assert device.endswith(f"device:CPU:{index}"), placed


@pytest.mark.parametrize("scale", [1e-30, 0.5, 0, -4.0])
def test_a_fixed_loss_scale_below_1_is_refused(scale):
    """Float16(loss_scale=1e-30) built and trained with weights that
    never moved (every gradient underflowed in float16)."""
    with pytest.raises(ValueError, match=r"finite number >= 1 .* the weights stop moving"):
        towerlib.Float16(loss_scale=scale)
    assert towerlib.Float16(loss_scale=1).loss_scale == 1.0


def test_a_loss_scale_given_as_an_array_is_named_in_one_line():
    """An array compared with 'dynamic' raised NumPy's 'truth value ... is ambiguous'."""
    with pytest.raises(ValueError, match=r"Float16\(loss_scale=array\(\[1024.,\s+2.\]\)\): "
                                         r"the loss scale must be"):
        towerlib.Float16(loss_scale=np.array([1024.0, 2.0]))

"""NaN/Inf guard: a non-finite tower loss or gradient stops training, names the
step and the tower, and neither the update nor a checkpoint of it happens."""

import os

import numpy as np
import pytest
import tensorflow as tf

import towerlib
from tests.fault_scripts import tiny_model
from towerlib.run import checkpoints


def _variables():
    return {v.op.name: v for v in tf.compat.v1.global_variables()}


def _run_steps(train, steps):
    """Runs `steps` steps in a plain Session; returns the variables' values then."""
    with tf.compat.v1.Session(config=tiny_model.session_config(2)) as session:
        session.run([tf.compat.v1.global_variables_initializer(),
                     tf.compat.v1.local_variables_initializer()])
        variables = _variables()
        for _ in range(steps):
            session.run(train.train_op)
        return session, variables, session.run(variables)


def test_guard_blocks_the_update_of_a_nan_step_in_the_graph():
    with tf.Graph().as_default():
        train = tiny_model.build(nan_loss_at_step=3, bad_tower=1)
        with tf.compat.v1.Session(config=tiny_model.session_config(2)) as session:
            session.run([tf.compat.v1.global_variables_initializer(),
                         tf.compat.v1.local_variables_initializer()])
            variables = _variables()
            session.run(train.train_op)
            session.run(train.train_op)
            before = session.run(variables)
            with pytest.raises(tf.errors.InvalidArgumentError,
                               match="towerlib numerics guard numerics_guard: "
                                     "a tower loss or gradient is NaN"):
                session.run(train.train_op)
            after = session.run(variables)
    assert any("Momentum" in name for name in before)
    assert after["global_step"] == 2
    for name in before:  # weights, Momentum slots, global_step: untouched
        np.testing.assert_array_equal(after[name], before[name], err_msg=name)


def test_without_the_guard_the_nan_step_reaches_the_weights():
    # The counterpart of the test above: the same fault corrupts an unguarded model.
    with tf.Graph().as_default():
        train = tiny_model.build(nan_loss_at_step=3, bad_tower=1, guarded=False)
        _, _, values = _run_steps(train, 3)
    assert values["global_step"] == 3
    assert not np.all(np.isfinite(values["hidden/weights"]))


def test_run_training_names_step_and_tower_and_keeps_the_last_good_checkpoint(tmp_path):
    train_dir = str(tmp_path / "train")
    with tf.Graph().as_default():
        train = tiny_model.build(nan_loss_at_step=4, bad_tower=1)
        with pytest.raises(towerlib.NonFiniteError) as raised:
            towerlib.run_training(
                train, train_dir=train_dir, max_steps=10, save_checkpoint_steps=1,
                session_config=tiny_model.session_config(2), save_summaries_steps=None)
    error = raised.value
    message = str(error)
    assert "Non-finite values at step 4:" in message
    assert "tower 1 (/device:CPU:1): the loss is NaN or Inf" in message
    assert "tower 0" not in message
    assert "was not applied" in message
    assert f"resumes from the last good checkpoint, {train_dir}/model.ckpt-3." in message
    assert (error.step, error.applied) == (4, False)
    _assert_checkpoints_good_up_to(train_dir, 3)


def test_gradient_check_names_the_variables_when_the_loss_is_finite(tmp_path):
    with tf.Graph().as_default():
        train = tiny_model.build(inf_gradient_at_step=2, bad_tower=0, check_gradients=True)
        with pytest.raises(towerlib.NonFiniteError) as raised:
            towerlib.run_training(
                train, train_dir=str(tmp_path / "train"), max_steps=5,
                save_checkpoint_steps=1, session_config=tiny_model.session_config(2),
                save_summaries_steps=None)
    message = str(raised.value)
    assert "at step 2:" in message
    assert ("tower 0 (/device:CPU:0): the gradient of hidden/weights, hidden/biases "
            "has NaN or Inf") in message
    assert "the loss is NaN" not in message and "tower 1" not in message
    _assert_checkpoints_good_up_to(str(tmp_path / "train"), 1)


def test_loss_only_guard_does_not_see_a_bad_gradient():
    # Why check_gradients exists: with a finite loss the loss check passes.
    with tf.Graph().as_default():
        train = tiny_model.build(inf_gradient_at_step=2, bad_tower=0)
        _, _, values = _run_steps(train, 2)
    assert not np.all(np.isfinite(values["hidden/weights"]))


def test_unguarded_optimizer_still_stops_before_saving_the_bad_step(tmp_path):
    train_dir = str(tmp_path / "train")
    with tf.Graph().as_default():
        train = tiny_model.build(nan_loss_at_step=3, bad_tower=1, guarded=False)
        with pytest.raises(towerlib.NonFiniteError) as raised:
            towerlib.run_training(
                train, train_dir=train_dir, max_steps=10, save_checkpoint_steps=1,
                session_config=tiny_model.session_config(2), save_summaries_steps=None)
    message = str(raised.value)
    assert "Non-finite values at step 3:" in message
    assert "tower 1 (/device:CPU:1): the loss is nan" in message
    assert "ran in memory, but training stopped before saving it" in message
    assert "towerlib.guard_numerics(optimizer)" in message
    assert raised.value.applied
    _assert_checkpoints_good_up_to(train_dir, 2)


def test_guard_gates_sparse_gradients_too():
    def embedding_model(inputs, ctx):
        """ids [B, 3] -> mean embedding -> 3 classes; tower 1's loss is NaN."""
        ids, labels = inputs
        vectors = tf.reduce_mean(towerlib.layers.embedding(ids, 10, 4, name="embed"), 1)
        logits = towerlib.layers.dense(vectors, 3, name="logits")
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=labels, logits=logits))
        return loss * np.float32(np.nan) if ctx.index == 1 else loss

    with tf.Graph().as_default():
        ids = tf.constant(np.arange(12).reshape(4, 3) % 10, tf.int32)
        labels = tf.constant([0, 1, 2, 0], tf.int32)
        train = towerlib.build_train_graph(
            embedding_model, (ids, labels),
            towerlib.guard_numerics(tf.compat.v1.train.GradientDescentOptimizer(0.1),
                                    check_gradients=True),
            num_towers=2)
        table_gradient = [g for g, v in train.grads_and_vars if "embed" in v.op.name][0]
        assert isinstance(table_gradient, tf.IndexedSlices)  # the sparse path is tested
        table = [v for v in tf.compat.v1.global_variables() if "embed" in v.op.name][0]
        with tf.compat.v1.Session(config=tiny_model.session_config(2)) as session:
            session.run([tf.compat.v1.global_variables_initializer(),
                         tf.compat.v1.local_variables_initializer()])
            before = session.run(table)
            with pytest.raises(tf.errors.InvalidArgumentError, match="numerics guard"):
                session.run(train.train_op)
            np.testing.assert_array_equal(session.run(table), before)


def _assert_checkpoints_good_up_to(train_dir, last_good_step):
    """The newest restorable checkpoint is `last_good_step`; all saved values finite."""
    latest = checkpoints.find_restorable_checkpoint(train_dir)
    assert checkpoints.checkpoint_step(latest) == last_good_step
    assert not [n for n in os.listdir(train_dir)
                if n.startswith(f"model.ckpt-{last_good_step + 1}.")]
    for prefix in checkpoints.read_state(train_dir):
        for name, value in tiny_model.checkpoint_values(prefix).items():
            assert np.all(np.isfinite(value)), (prefix, name)


def test_one_guard_guards_one_update():
    with tf.Graph().as_default():
        guard = towerlib.guard_numerics(tf.compat.v1.train.GradientDescentOptimizer(0.1))
        weights = tf.compat.v1.get_variable("w", initializer=1.0)
        guard.minimize(weights * weights)
        with pytest.raises(RuntimeError, match="wrap the optimizer again for each train"):
            guard.minimize(2.0 * weights)

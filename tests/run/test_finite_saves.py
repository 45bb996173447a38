"""No checkpoint with a NaN or Inf variable is ever saved: an Inf
gradient that the loss-only guard lets through makes the weights Inf while the loss of
that step is finite; the save of that step (periodic or final) is refused, naming the
variable, and the newest checkpoint stays the last good one."""

import os

import numpy as np
import pytest
import tensorflow as tf

import towerlib
from tests.fault_scripts import tiny_model
from towerlib.run import checkpoints


def _train(train_dir, max_steps, save_every, **model):
    with tf.Graph().as_default():
        train = tiny_model.build(**model)
        return towerlib.run_training(
            train, train_dir=train_dir, max_steps=max_steps, save_summaries_steps=None,
            save_checkpoint_steps=save_every, session_config=tiny_model.session_config(2))


def _all_saved_values_finite(train_dir):
    for prefix in checkpoints.read_state(train_dir):
        for name, value in tiny_model.checkpoint_values(prefix).items():
            assert np.all(np.isfinite(value)), (prefix, name)


@pytest.mark.parametrize("save_every, inf_at, last_good", [(1000, 2, 0), (1, 3, 2)])
def test_weights_made_inf_by_a_finite_loss_step_are_never_saved(
        tmp_path, save_every, inf_at, last_good):
    train_dir = str(tmp_path / "train")
    with pytest.raises(towerlib.NonFiniteError) as raised:
        _train(train_dir, 5 if save_every == 1 else inf_at, save_every,
               inf_gradient_at_step=inf_at)
    message = str(raised.value)
    assert message.splitlines()[0] == f"Non-finite values at step {inf_at}:"
    assert f"the variable hidden/weights holds NaN or Inf (and 3 more: " in message
    assert f"the checkpoint of step {inf_at} was not saved" in message
    assert f"model.ckpt-{last_good}" in message
    assert not os.path.exists(os.path.join(train_dir, f"model.ckpt-{inf_at}.index"))
    newest = checkpoints.find_restorable_checkpoint(train_dir)
    assert checkpoints.checkpoint_step(newest) == last_good
    _all_saved_values_finite(train_dir)


def test_finite_runs_save_as_before(tmp_path):
    train_dir = str(tmp_path / "train")
    assert _train(train_dir, 3, 1).global_step == 3
    assert [checkpoints.checkpoint_step(p) for p in checkpoints.read_state(train_dir)] == \
        [0, 1, 2, 3]


def _adam_slot_overflows_at_step_4(inputs, ctx):
    """Adam's second moment of 'a' is Inf at step 4 (the step from 3 has a gradient
    of 1e30, squared), while 'a' stays finite (its update is m / sqrt(Inf) = 0), and
    so does the loss. (One more such step would make it NaN: Inf - Inf.)"""
    a = tf.compat.v1.get_variable("a", [1], initializer=tf.ones_initializer())
    spike = tf.where(tf.equal(tf.compat.v1.train.get_global_step(), 3), 1e30, 0.0)
    return tf.reduce_mean(inputs * a) + spike * tf.reduce_sum(a)


def test_a_best_checkpoint_with_an_inf_slot_is_never_saved(tmp_path):
    """The metric (the step: each evaluation improves) stays finite while a slot
    does not: the best checkpoint of step 4 is refused as every save is, and
    train_dir/best keeps step 2."""
    with tf.Graph().as_default():
        train = towerlib.build_train_graph(
            _adam_slot_overflows_at_step_4, tf.ones([4, 1]),
            tf.compat.v1.train.AdamOptimizer(0.1), num_towers=2)
        step = tf.compat.v1.train.get_global_step()
        evaluation = towerlib.Evaluation(
            towerlib.build_eval_graph(
                lambda inputs, ctx: {"step": tf.cast(step, tf.float32) + 0.0 * inputs[:, 0]},
                tf.ones([4, 1]), num_towers=2),
            every_n_steps=2, metric="step", num_batches=1)
        with pytest.raises(towerlib.NonFiniteError) as raised:
            towerlib.run_training(
                train, train_dir=str(tmp_path), max_steps=6, save_summaries_steps=None,
                save_checkpoint_steps=100, evaluation=evaluation,
                session_config=towerlib.session_config(2))
    message = str(raised.value)
    assert "Non-finite values at step 4" in message
    assert "the variable a/Adam_1 holds NaN or Inf" in message
    assert "the best checkpoint of step 4 was not saved" in message
    best = checkpoints.find_restorable_checkpoint(str(tmp_path / "best"))
    assert best.endswith("-2"), best
    reader = tf.train.load_checkpoint(best)
    for name in reader.get_variable_to_shape_map():
        assert np.all(np.isfinite(reader.get_tensor(name))), name

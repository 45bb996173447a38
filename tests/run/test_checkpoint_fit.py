"""A checkpoint that does not fit the graph is refused before the first step, and a
session that keeps failing is recreated a bounded number of times."""

import os

import numpy as np
import pytest
import tensorflow as tf

import towerlib
from tests.fault_scripts import tiny_model
from towerlib.run import sessions as trainer

CONFIG = tiny_model.session_config(2)


class CreationLimit(tf.compat.v1.train.SessionRunHook):
    """Fails the test instead of hanging when sessions are created over and over."""

    def __init__(self, limit=4):
        self.limit, self.created = limit, 0

    def after_create_session(self, session, coord):
        self.created += 1
        if self.created > self.limit:
            raise AssertionError(f"{self.created} sessions created: the loop is unbounded")


def _train(train_dir, max_steps, hooks=(), save_checkpoint_steps=1000, **model):
    with tf.Graph().as_default():
        train = tiny_model.build(**model)
        return towerlib.run_training(
            train, train_dir=train_dir, max_steps=max_steps, session_config=CONFIG,
            save_summaries_steps=None, save_checkpoint_steps=save_checkpoint_steps,
            hooks=list(hooks))


@pytest.mark.parametrize("model, variable, shapes", [
    (dict(hidden_units=4), "hidden/weights", "[6, 8] in the checkpoint, [6, 4] in the graph"),
    (dict(num_classes=5), "logits/weights", "[8, 3] in the checkpoint, [8, 5] in the graph"),
])
def test_a_checkpoint_of_another_shape_is_refused_before_the_first_step(
        tmp_path, model, variable, shapes):
    train_dir = str(tmp_path / "train")
    _train(train_dir, 2)
    limit = CreationLimit()
    with pytest.raises(towerlib.CheckpointError) as raised:
        _train(train_dir, 4, hooks=[limit], **model)
    first_line = str(raised.value).splitlines()[0]
    assert "does not fit this graph" in first_line
    assert f"{variable}: {shapes}" in first_line
    assert "another train_dir" in first_line and "restore_from=" in first_line
    assert limit.created == 0  # refused before any session
    assert towerlib.find_restorable_checkpoint(train_dir).endswith("model.ckpt-2")


def test_a_checkpoint_variable_of_another_dtype_is_refused(tmp_path):
    train_dir = str(tmp_path / "train")
    _train(train_dir, 2)
    source = tf.train.load_checkpoint(os.path.join(train_dir, "model.ckpt-2"))
    other_dir = str(tmp_path / "other")
    with tf.Graph().as_default():
        values = {name: source.get_tensor(name)
                  for name in source.get_variable_to_shape_map()}
        values["hidden/biases"] = values["hidden/biases"].astype(np.float64)
        variables = {name: tf.compat.v1.Variable(value) for name, value in values.items()}
        saver = tf.compat.v1.train.Saver(variables)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            saver.save(session, os.path.join(other_dir, "model.ckpt-2"))
    with pytest.raises(towerlib.CheckpointError,
                       match=r"hidden/biases: float64 in the checkpoint, float32 in the graph"):
        _train(other_dir, 4, hooks=[CreationLimit()])


def test_a_missing_variable_is_named(tmp_path):
    train_dir = str(tmp_path / "train")
    with tf.Graph().as_default():
        step = tf.compat.v1.train.get_or_create_global_step()
        saver = tf.compat.v1.train.Saver([step])
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            saver.save(session, os.path.join(train_dir, "model.ckpt-0"))
    with pytest.raises(towerlib.CheckpointError, match=r"hidden/biases: missing from"):
        _train(train_dir, 4, hooks=[CreationLimit()])


def test_restore_from_a_checkpoint_that_fits_still_trains(tmp_path):
    train_dir = str(tmp_path / "train")
    _train(train_dir, 2)
    assert _train(train_dir, 3).global_step == 3


class AbortEveryStep(tf.compat.v1.train.SessionRunHook):
    """Every step fails as a restarted ps task makes it fail."""

    def __init__(self, limit=40):
        self.limit, self.aborts = limit, 0

    def before_run(self, run_context):
        self.aborts += 1
        if self.aborts > self.limit:
            raise AssertionError(f"{self.aborts} aborted steps: the recreation is unbounded")
        raise tf.errors.AbortedError(None, None, "a ps task restarted (test)")


def test_session_recreation_is_bounded_by_a_count(tmp_path, monkeypatch):
    monkeypatch.setattr(trainer, "MAX_SESSION_RECREATIONS", 3)
    hook = AbortEveryStep()
    with pytest.raises(trainer.SessionRecreationError) as raised:
        _train(str(tmp_path / "train"), 5, hooks=[hook])
    first_line = str(raised.value).splitlines()[0]
    assert "recreated 3 times" in first_line and "without completing a step" in first_line
    assert "Fix:" in first_line
    assert hook.aborts == 4


def test_session_recreation_is_bounded_by_a_time(tmp_path, monkeypatch):
    monkeypatch.setattr(trainer, "SESSION_RECREATION_SECS", 0.0)
    with pytest.raises(trainer.SessionRecreationError, match=r"within 0 s|for \d+ s"):
        _train(str(tmp_path / "train"), 5, hooks=[AbortEveryStep()])


def test_a_completed_step_resets_the_count(tmp_path, monkeypatch):
    monkeypatch.setattr(trainer, "MAX_SESSION_RECREATIONS", 2)

    class AbortEveryOtherStep(tf.compat.v1.train.SessionRunHook):
        calls = 0

        def before_run(self, run_context):
            self.calls += 1
            if self.calls % 2:
                raise tf.errors.AbortedError(None, None, "a ps task restarted (test)")

    # A checkpoint every step: each recreated session restores the newest one, so the
    # run moves on (with the default every 1000 steps it would roll back to step 0).
    result = _train(str(tmp_path / "train"), 6, hooks=[AbortEveryOtherStep()],
                    save_checkpoint_steps=1)
    assert result.global_step == 6

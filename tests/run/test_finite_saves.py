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

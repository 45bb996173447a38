"""Bad configuration: every problem reported at once, each with its fix."""

import os
import sys

import pytest
import tensorflow as tf

import towerlib
from tests.fault_scripts import tiny_model

NO_GPU = not tf.config.list_physical_devices("GPU")


def _problems(**options):
    with pytest.raises(towerlib.ConfigError) as raised:
        towerlib.validate_config(**options)
    return raised.value, {p.option: str(p) for p in raised.value.problems}


def test_every_problem_is_reported_at_once_with_its_fix(tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("not a directory")
    error, problems = _problems(
        num_towers=0, bn_mode="sync_all", update="mirrored", ema_decay=1.5,
        train_dir=str(a_file / "train"), max_steps=-1, save_checkpoint_steps=10,
        save_checkpoint_secs=60, is_chief=False, master="")
    assert list(problems) == [
        "num_towers", "bn_mode", "update", "ema_decay", "train_dir", "max_steps",
        "save_checkpoint_steps/save_checkpoint_secs", "is_chief"]
    assert str(error).startswith(
        "8 problems in the training configuration (num_towers, bn_mode, update, ema_decay, "
        "train_dir, max_steps, save_checkpoint_steps/save_checkpoint_secs, is_chief; "
        "nothing was built or run):")
    assert all(" Fix: " in text for text in problems.values())
    assert "num_towers: num_towers must be at least 1, got 0. Fix: pass the number of GPUs" \
        in problems["num_towers"]
    assert "pick one of first_tower, all_towers, sync" in problems["bn_mode"]
    assert f"cannot be created: {a_file} is a file" in problems["train_dir"]
    assert "give only one of them" in problems["save_checkpoint_steps/save_checkpoint_secs"]
    assert "pass master='grpc://...'" in problems["is_chief"]


def test_contradicting_batch_options_name_both_values():
    _, problems = _problems(num_towers=4, global_batch_size=30, per_tower_batch_size=8,
                            examples_per_step=64)
    assert ("per_tower_batch_size: 8 x 4 towers = 32, but global_batch_size is 30. "
            "Fix: give only one of them") in problems["per_tower_batch_size"]
    assert "examples_per_step: is 64 but global_batch_size is 30" \
        in problems["examples_per_step"]
    _, problems = _problems(num_towers=4, global_batch_size=3)
    assert "fewer than the 4 towers" in problems["global_batch_size"]


@pytest.mark.skipif(not NO_GPU, reason="checks the messages of a machine without GPUs")
def test_devices_that_do_not_exist_or_contradict():
    error, _ = _problems(
        num_towers=3, devices=["/device:GPU:0", "gpu zero", "/device:CPU:1",
                               "/device:CPU:1", "/device:TPU:0"],
        session_config=towerlib.session_config(1))
    text = str(error)
    assert "devices[0] = '/device:GPU:0' does not exist: this machine has 0 GPU(s)" in text
    assert "devices[1] = 'gpu zero' is not a device string" in text
    assert ("devices[2] = '/device:CPU:1' needs 2 CPU devices but the session config asks "
            "for 1. Fix: build the config with towerlib.session_config(2)") in text
    assert "devices[3] = '/device:CPU:1' is the same device as devices[2]" in text
    assert "devices[4] = '/device:TPU:0' has device type TPU" in text
    assert "num_towers: num_towers=3 but 5 devices were given" in text
    _, problems = _problems(num_towers=2, device_type="gpu")
    assert "TensorFlow sees no GPU" in problems["device_type"]
    _, problems = _problems(num_towers=4, session_config=towerlib.session_config(2))
    assert "use towerlib.session_config(4)" in problems["session_config"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux's /sys")
def test_unwritable_train_dir_is_found_by_trying():
    # Permission bits say root may write /sys; writing says otherwise.
    _, problems = _problems(train_dir="/sys")
    assert "train_dir: /sys is not writable (" in problems["train_dir"]
    _, problems = _problems(train_dir="/sys/towerlib_train")
    assert "cannot be created: /sys is not writable" in problems["train_dir"]


def test_a_good_configuration_passes_and_leaves_nothing_behind(tmp_path):
    train_dir = tmp_path / "not_yet"
    towerlib.validate_config(
        num_towers=2, global_batch_size=9, bn_mode="all_towers", update=towerlib.ParameterServer(device="cpu"),
        ema_decay=0.99, learning_rate=0.1, train_dir=str(train_dir), max_steps=100,
        save_checkpoint_secs=600, save_summaries_steps=100, log_every_n_steps=10,
        examples_per_step=9, max_checkpoints_to_keep=3,
        session_config=towerlib.session_config(2))
    assert not train_dir.exists()
    assert os.listdir(tmp_path) == []


def test_run_training_validates_before_creating_anything(tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    with tf.Graph().as_default():
        train = tiny_model.build()
        with pytest.raises(towerlib.ConfigError) as raised:
            towerlib.run_training(
                train, train_dir=str(a_file / "train"), max_steps=5,
                save_checkpoint_steps=1, save_checkpoint_secs=1, log_every_n_steps=0)
    options = [p.option for p in raised.value.problems]
    assert options == ["train_dir", "save_checkpoint_steps/save_checkpoint_secs",
                       "log_every_n_steps"]
    assert isinstance(raised.value, ValueError)  # what run_training raised before
    assert sorted(os.listdir(tmp_path)) == ["a_file"]


def test_run_training_requires_train_dir_and_max_steps():
    with tf.Graph().as_default():
        train = tiny_model.build()
        with pytest.raises(towerlib.ConfigError) as raised:
            towerlib.run_training(train, train_dir=None, max_steps=None)
    assert [str(p) for p in raised.value.problems] == [
        "train_dir: is required. Fix: give a directory for checkpoints and summaries.",
        "max_steps: is required. Fix: give the global step to stop at."]

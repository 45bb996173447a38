"""towerlib never writes or deletes through a link it did not create: a run folder whose
control entries (.towerlib-lock, .saving, checkpoint) are symbolic links is refused in one
line, and the file or folder the link points at is left as it was."""

import os

import pytest
import tensorflow as tf

import towerlib
from tests.fault_scripts import tiny_model
from towerlib.cluster import exits
from towerlib.run import checkpoints, durable_files, folder_lock


def user_folder(tmp_path):
    """A user's folder of two files, outside the run folder."""
    folder = tmp_path / "my_data"
    folder.mkdir()
    for name in ("a.txt", "b.txt"):
        (folder / name).write_text("mine")
    return folder


def assert_intact(folder):
    assert sorted(os.listdir(folder)) == ["a.txt", "b.txt"]
    assert all((folder / name).read_text() == "mine" for name in ("a.txt", "b.txt"))


def test_a_lock_file_that_links_to_a_users_file_is_refused_and_not_written(tmp_path):
    train_dir = tmp_path / "run"
    train_dir.mkdir()
    mine = tmp_path / "notes.txt"
    mine.write_text("my notes")
    os.symlink(mine, train_dir / folder_lock.LOCK_FILENAME)
    with pytest.raises(folder_lock.LinkedEntryError) as raised:
        folder_lock.hold(train_dir)
    line = str(raised.value)
    assert "\n" not in line and f".towerlib-lock -> {mine} is a symbolic link" in line
    assert "Fix: remove the link" in line
    assert mine.read_text() == "my notes"
    assert exits.exit_status(raised.value) == exits.USER_ERROR


def test_a_link_planted_after_the_check_is_not_followed(tmp_path, monkeypatch):
    """The lock file is opened with O_NOFOLLOW: the check and the open cannot race."""
    train_dir = tmp_path / "run"
    train_dir.mkdir()
    mine = tmp_path / "notes.txt"
    mine.write_text("my notes")
    os.symlink(mine, train_dir / folder_lock.LOCK_FILENAME)
    monkeypatch.setattr(folder_lock, "refuse_linked_entries", lambda train_dir: None)
    with pytest.raises(folder_lock.LinkedEntryError):
        folder_lock.hold(train_dir)
    assert mine.read_text() == "my notes"


@pytest.mark.parametrize("entry", [checkpoints.SAVING_DIRNAME, checkpoints.STATE_FILENAME])
def test_a_linked_saving_folder_or_state_file_is_refused(tmp_path, entry):
    train_dir = tmp_path / "run"
    train_dir.mkdir()
    folder = user_folder(tmp_path)
    os.symlink(folder, train_dir / entry)
    with pytest.raises(folder_lock.LinkedEntryError, match=f"{entry} -> "):
        checkpoints.remove_leftovers(str(train_dir))
    with pytest.raises(folder_lock.LinkedEntryError):
        folder_lock.hold(train_dir)
    assert_intact(folder)


def test_a_dead_trainers_lock_file_is_reused_and_state_files_still_write(tmp_path):
    folder_lock.hold(tmp_path).release()
    held = folder_lock.hold(tmp_path)   # a dead trainer's file: reused
    assert (tmp_path / folder_lock.LOCK_FILENAME).read_text().startswith(
        f"pid {os.getpid()} on ")
    held.release()
    target = tmp_path / "state"
    durable_files.atomic_write_text(str(target), "x\n")
    assert target.read_text() == "x\n"


def test_run_training_refuses_a_linked_saving_folder_and_empties_nothing(tmp_path):
    """The reported case: the user's folder was emptied, then a TensorFlow traceback."""
    train_dir = tmp_path / "run"
    train_dir.mkdir()
    folder = user_folder(tmp_path)
    os.symlink(folder, train_dir / checkpoints.SAVING_DIRNAME)
    with tf.Graph().as_default():
        with pytest.raises(towerlib.CheckpointError) as raised:
            towerlib.run_training(tiny_model.build(), train_dir=str(train_dir), max_steps=2,
                                  session_config=tiny_model.session_config(2),
                                  save_summaries_steps=None)
    assert "\n" not in str(raised.value) and ".saving -> " in str(raised.value)
    assert_intact(folder)
    assert sorted(os.listdir(train_dir)) == [checkpoints.SAVING_DIRNAME]

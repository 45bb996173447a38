"""A full disk or a garbled state file: nothing half-written stays, nothing crashes a restart."""

import errno
import os

import numpy as np
import pytest
import tensorflow as tf

from towerlib.run import checkpoints, durable_files


@pytest.fixture
def saved_model(tmp_path):
    """A session holding w = 3 and global_step = 3, saved as checkpoint 3 in tmp_path."""
    graph = tf.Graph()
    with graph.as_default():
        weights = tf.compat.v1.get_variable("w", initializer=tf.fill([4, 3], 3.0))
        step = tf.compat.v1.train.get_or_create_global_step()
        saver = tf.compat.v1.train.Saver(sharded=True)
        session = tf.compat.v1.Session(graph=graph)
        session.run([weights.initializer, step.assign(3)])
    writer = checkpoints.CheckpointWriter(saver, str(tmp_path))
    writer.save(session, 3)
    yield session, writer
    session.close()


@pytest.mark.parametrize("garbage", [os.urandom(300), b"\xff\xfe\x00 not utf-8",
                                     b"model_checkpoint_path: 12 {{{"])
def test_a_state_file_of_any_bytes_falls_back_to_the_scan(saved_model, tmp_path, garbage):
    with open(tmp_path / checkpoints.STATE_FILENAME, "wb") as handle:
        handle.write(garbage)
    assert checkpoints.read_state(str(tmp_path)) == []
    assert checkpoints.find_restorable_checkpoint(str(tmp_path)) == str(tmp_path / "model.ckpt-3")


def test_a_save_that_runs_out_of_disk_leaves_no_partial_files(saved_model, tmp_path,
                                                             monkeypatch):
    session, writer = saved_model
    real_save = writer.saver.save

    def save_until_the_disk_is_full(sess, prefix, **kwargs):
        real_save(sess, prefix, **kwargs)  # the files exist, as a full disk would leave them
        raise tf.errors.ResourceExhaustedError(None, None, "No space left on device")

    monkeypatch.setattr(writer.saver, "save", save_until_the_disk_is_full)
    with pytest.raises(checkpoints.CheckpointError) as raised:
        writer.save(session, 4)
    line = str(raised.value)
    assert "\n" not in line and line.startswith(
        f"Saving the checkpoint of step 4 in {tmp_path} failed: no space left on device. "
        "Fix: free space on that disk")
    assert line.endswith(f"it resumes from {tmp_path / 'model.ckpt-3'}, which is intact.")
    assert not os.path.exists(tmp_path / checkpoints.SAVING_DIRNAME)
    assert sorted(os.listdir(tmp_path)) == sorted(
        ["checkpoint", "model.ckpt-3.data-00000-of-00001", "model.ckpt-3.index",
         "model.ckpt-3.meta"])
    assert checkpoints.find_restorable_checkpoint(str(tmp_path)) == str(tmp_path / "model.ckpt-3")
    np.testing.assert_array_equal(
        tf.train.load_checkpoint(str(tmp_path / "model.ckpt-3")).get_tensor("w"),
        np.full([4, 3], 3.0))


def test_a_state_write_that_runs_out_of_disk_leaves_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / "checkpoint"
    target.write_text("old\n")

    def no_space(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_space)
    with pytest.raises(OSError):
        durable_files.atomic_write_text(str(target), "new\n")
    assert os.listdir(tmp_path) == ["checkpoint"]
    assert target.read_text() == "old\n"

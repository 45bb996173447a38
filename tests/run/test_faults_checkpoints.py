"""Checkpoint files after every kind of interruption: what is restored, what is not.

Each test builds on disk the state a kill (or a disk fault) leaves behind,
at a point the subprocess test cannot hit reliably (inside TensorFlow's
SaveV2/MergeV2Checkpoints), and checks which checkpoint a restart picks.
"""

import logging
import os

import numpy as np
import pytest
import tensorflow as tf

import towerlib
from tests.fault_scripts import tiny_model
from towerlib.run import checkpoints, durable_files


class Model:
    """One [4, 3] variable and global_step, both set to `step` before each save."""

    def __init__(self):
        self.graph = tf.Graph()
        with self.graph.as_default():
            self.weights = tf.compat.v1.get_variable("w", initializer=tf.zeros([4, 3]))
            self.global_step = tf.compat.v1.train.get_or_create_global_step()
            self.value = tf.compat.v1.placeholder(tf.int64, [])
            self.assign = tf.group(
                self.weights.assign(tf.fill([4, 3], tf.cast(self.value, tf.float32))),
                self.global_step.assign(self.value))
            self.saver = tf.compat.v1.train.Saver(sharded=True)  # the Scaffold's kind
        self.session = tf.compat.v1.Session(graph=self.graph)

    def save_steps(self, train_dir, steps, max_to_keep=5):
        writer = checkpoints.CheckpointWriter(self.saver, train_dir, max_to_keep=max_to_keep)
        for step in steps:
            self.session.run(self.assign, {self.value: step})
            writer.save(self.session, step)
        return writer


@pytest.fixture
def model():
    built = Model()
    yield built
    built.session.close()


def _prefix(train_dir, step):
    return os.path.join(train_dir, f"model.ckpt-{step}")


def _weights(prefix):
    return tf.train.load_checkpoint(prefix).get_tensor("w")


def test_writer_publishes_the_index_last_and_the_state_after_it(model, tmp_path, monkeypatch):
    train_dir = str(tmp_path)
    renames = []
    original = durable_files.rename
    monkeypatch.setattr(durable_files, "rename",
                        lambda s, t: (renames.append(os.path.basename(t)), original(s, t)))
    model.save_steps(train_dir, [7])
    assert renames[-2:] == ["model.ckpt-7.index", "checkpoint"]
    assert renames[0] == checkpoints.JOURNAL_FILENAME  # what a kill would leave, named first
    assert set(renames[1:-2]) == {"model.ckpt-7.data-00000-of-00001", "model.ckpt-7.meta"}
    assert tf.train.latest_checkpoint(train_dir) == _prefix(train_dir, 7)
    assert os.listdir(os.path.join(train_dir, checkpoints.SAVING_DIRNAME)) == []


def test_retention_drops_old_checkpoints_from_the_state_before_deleting_them(
        model, tmp_path):
    train_dir = str(tmp_path)
    writer = model.save_steps(train_dir, [1, 2, 3, 4], max_to_keep=2)
    assert writer.kept == [_prefix(train_dir, 3), _prefix(train_dir, 4)]
    assert checkpoints.read_state(train_dir) == writer.kept
    assert sorted(n for n in os.listdir(train_dir) if n.startswith("model.ckpt-")) == [
        f"model.ckpt-{s}{suffix}" for s in (3, 4)
        for suffix in (".data-00000-of-00001", ".index", ".meta")]


def test_stock_latest_checkpoint_names_a_half_written_index_towerlib_falls_back(
        model, tmp_path, caplog):
    # TensorFlow's sharded save writes the merged .index in place, so a kill
    # while a restarted chief re-saves its latest step truncates that index.
    train_dir = str(tmp_path)
    model.save_steps(train_dir, [2, 4])
    index = _prefix(train_dir, 4) + ".index"
    with open(index, "rb") as handle:
        head = handle.read()[:40]
    with open(index, "wb") as handle:
        handle.write(head)
    assert tf.train.latest_checkpoint(train_dir) == _prefix(train_dir, 4)
    with caplog.at_level(logging.WARNING, logger="towerlib"):
        chosen = checkpoints.find_restorable_checkpoint(train_dir)
    assert chosen == _prefix(train_dir, 2)
    assert f"Not restoring checkpoint {_prefix(train_dir, 4)}: it cannot be read" in caplog.text
    assert f"Falling back to {_prefix(train_dir, 2)}" in caplog.text


@pytest.mark.parametrize("damage, reason", [
    ("remove_data", "it has no data file"),
    ("flip_data_byte", "Checksum does not match"),
    ("truncate_data", "cannot be read"),
    ("remove_index", "the save did not finish"),
])
def test_damaged_latest_checkpoint_is_skipped(model, tmp_path, caplog, damage, reason):
    train_dir = str(tmp_path)
    model.save_steps(train_dir, [2, 4])
    data = _prefix(train_dir, 4) + ".data-00000-of-00001"
    if damage == "remove_data":
        os.remove(data)
    elif damage == "remove_index":
        os.remove(_prefix(train_dir, 4) + ".index")
    else:
        with open(data, "rb") as handle:
            content = bytearray(handle.read())
        if damage == "flip_data_byte":
            content[len(content) // 2] ^= 0xFF
        else:
            content = content[:len(content) // 2]
        with open(data, "wb") as handle:
            handle.write(bytes(content))
    with caplog.at_level(logging.WARNING, logger="towerlib"):
        chosen = checkpoints.find_restorable_checkpoint(train_dir)
    assert chosen == _prefix(train_dir, 2)
    assert reason in caplog.text
    np.testing.assert_array_equal(_weights(chosen), np.full([4, 3], 2.0))


def test_complete_checkpoint_missing_from_the_state_is_found(model, tmp_path, caplog):
    # A kill between publishing step 6 and writing the state file.
    train_dir = str(tmp_path)
    model.save_steps(train_dir, [2, 4, 6])
    checkpoints.write_state(train_dir, [_prefix(train_dir, 2), _prefix(train_dir, 4)])
    # The half-written state, where towerlib writes its temporary.
    temporary = os.path.join(train_dir, checkpoints.SAVING_DIRNAME, "checkpoint.tmp-" + "0123abcd" * 4)
    with open(temporary, "w") as handle:
        handle.write("model_checkpoint_path: \"model.ck")
    with caplog.at_level(logging.WARNING, logger="towerlib"):
        assert checkpoints.prepare_restore(train_dir) == _prefix(train_dir, 6)
    assert "rewrote it" in caplog.text
    assert tf.train.latest_checkpoint(train_dir) == _prefix(train_dir, 6)
    assert not os.path.exists(temporary)


def test_garbage_state_file_falls_back_to_scanning(model, tmp_path):
    train_dir = str(tmp_path)
    model.save_steps(train_dir, [3, 5])
    with open(os.path.join(train_dir, "checkpoint"), "w") as handle:
        handle.write("\x00\x17 not a checkpoint state")
    assert checkpoints.find_restorable_checkpoint(train_dir) == _prefix(train_dir, 5)


def test_no_restorable_checkpoint_is_an_error_naming_each_file(model, tmp_path):
    train_dir = str(tmp_path)
    model.save_steps(train_dir, [1, 2])
    for step in (1, 2):
        os.remove(_prefix(train_dir, step) + ".data-00000-of-00001")
    with pytest.raises(towerlib.CheckpointError) as raised:
        checkpoints.find_restorable_checkpoint(train_dir)
    message = str(raised.value)
    for step in (1, 2):
        assert f"{_prefix(train_dir, step)}: it has no data file" in message
    assert "move these files away to start training from scratch" in message


def test_leftovers_of_killed_writers_are_removed_and_nothing_else(model, tmp_path):
    train_dir = str(tmp_path)
    model.save_steps(train_dir, [3])
    # What a killed save leaves: all of it inside .saving, where towerlib writes.
    leftovers = [os.path.join(checkpoints.SAVING_DIRNAME, name) for name in (
        "model.ckpt-5.index", "model.ckpt-5.data-00000-of-00001.tempstate1234567890",
        "model.ckpt-5.meta.tmp" + "fedcba9876543210" * 2,
        os.path.join("model.ckpt-5_temp", "part-00000-of-00001.index"),
        "checkpoint.tmp-" + "0123456789abcdef" * 2)]   # towerlib's state temporary
    # A user's files of names like those of leftovers: never towerlib's to delete.
    keep = ["notes.txt", "eval_temp", "events.out.tfevents.1.host",
            "model.ckpt-7.data-00000-of-00001", "checkpoint.tmp_notes", "checkpoint.tmp.keep",
            "checkpoint_notes.txt", os.path.join("mine-3_temp", "results.csv"),
            "results.tempstate7", "draft.tmp" + "0123456789abcdef" * 2,
            "checkpoint.tmp-" + "0123456789abcdef" * 2,
            "model.ckpt-5.meta.tmp" + "fedcba9876543210" * 2,
            os.path.join("export-5_temp", "part-00000-of-00001.index")]
    for name in leftovers + keep:
        path = os.path.join(train_dir, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as handle:
            handle.write("x")
    removed = checkpoints.remove_leftovers(train_dir)
    assert removed == [os.path.join(train_dir, checkpoints.SAVING_DIRNAME)]
    for name in keep:
        assert os.path.exists(os.path.join(train_dir, name)), name
    assert checkpoints.checkpoint_problem(_prefix(train_dir, 3)) is None


def test_a_killed_publish_or_delete_is_undone_by_its_journal(model, tmp_path, monkeypatch):
    # Data shards whose index is missing go only when the writer's journal names them.
    train_dir = str(tmp_path)
    model.save_steps(train_dir, [1, 2], max_to_keep=1)  # step 1 deleted, step 2 kept

    def killed(source, target):
        if target.endswith("model.ckpt-3.index"):
            raise KeyboardInterrupt("killed before the index")  # a SIGKILL stand-in
        os.replace(source, target)

    monkeypatch.setattr(durable_files, "rename", killed)
    with pytest.raises(KeyboardInterrupt):
        model.save_steps(train_dir, [3], max_to_keep=1)
    monkeypatch.undo()
    user_file = os.path.join(train_dir, "model.ckpt-7.data-00000-of-00001")
    with open(user_file, "w") as handle:
        handle.write("mine")
    assert os.path.exists(_prefix(train_dir, 3) + ".data-00000-of-00001")
    removed = checkpoints.remove_leftovers(train_dir)
    assert _prefix(train_dir, 3) + ".data-00000-of-00001" in removed
    assert checkpoints.checkpoint_files(_prefix(train_dir, 3)) == []
    assert os.path.exists(user_file)
    assert checkpoints.checkpoint_problem(_prefix(train_dir, 2)) is None


def test_run_training_into_a_folder_of_user_files_deletes_none(tmp_path):
    train_dir = str(tmp_path / "mine")
    names = ["model.ckpt-7.data-00000-of-00001", "checkpoint.tmp_notes",
             "checkpoint.tmp.keep", "checkpoint_notes.txt",
             os.path.join("export", "my_model", "saved_model.pb")]
    for name in names:
        os.makedirs(os.path.dirname(os.path.join(train_dir, name)), exist_ok=True)
        with open(os.path.join(train_dir, name), "w") as handle:
            handle.write("mine")
    with tf.Graph().as_default():
        towerlib.run_training(tiny_model.build(), train_dir=train_dir, max_steps=2,
                              session_config=tiny_model.session_config(2),
                              save_summaries_steps=None)
    for name in names:
        with open(os.path.join(train_dir, name)) as handle:
            assert handle.read() == "mine", name


def test_incomplete_checkpoint_at_the_same_step_is_replaced(model, tmp_path, caplog):
    train_dir = str(tmp_path)
    model.save_steps(train_dir, [2, 4])
    with open(_prefix(train_dir, 4) + ".index", "wb") as handle:
        handle.write(b"torn")  # a stock TensorFlow save killed in MergeV2Checkpoints
    prefix = checkpoints.prepare_restore(train_dir)
    assert prefix == _prefix(train_dir, 2)
    with model.graph.as_default():
        model.saver.restore(model.session, prefix)
    model.session.run(model.assign, {model.value: 40})
    writer = checkpoints.CheckpointWriter(model.saver, train_dir)
    assert writer.kept == [_prefix(train_dir, 2)]
    with caplog.at_level(logging.WARNING, logger="towerlib"):
        writer.save(model.session, 4)
    assert f"Deleting the incomplete checkpoint {_prefix(train_dir, 4)}" in caplog.text
    np.testing.assert_array_equal(_weights(_prefix(train_dir, 4)), np.full([4, 3], 40.0))
    assert checkpoints.checkpoint_problem(_prefix(train_dir, 4)) is None


def test_the_restored_step_is_not_saved_over(model, tmp_path):
    # TensorFlow's CheckpointSaverHook re-saves the restored step at session
    # creation; towerlib does not rewrite a complete checkpoint unless told to.
    train_dir = str(tmp_path)
    model.save_steps(train_dir, [4])
    index = _prefix(train_dir, 4) + ".index"
    written = os.stat(index).st_mtime_ns
    writer = checkpoints.CheckpointWriter(model.saver, train_dir)
    model.session.run(model.assign, {model.value: 4})
    assert writer.save(model.session, 4) == _prefix(train_dir, 4)
    assert os.stat(index).st_mtime_ns == written


def test_a_step_saved_before_is_saved_over_when_asked(model, tmp_path, caplog):
    # Across workers with slots sharded over them every save is an exchange that every
    # worker joins, so a worker whose folder holds that step from an earlier run saves
    # it again (replace=True), with this run's values, listed once in the state.
    train_dir = str(tmp_path)
    model.save_steps(train_dir, [2, 4])
    writer = checkpoints.CheckpointWriter(model.saver, train_dir)
    model.session.run(model.assign, {model.value: 40})
    with caplog.at_level(logging.WARNING, logger="towerlib"):
        assert writer.save(model.session, 4, replace=True) == _prefix(train_dir, 4)
    assert f"Deleting the earlier checkpoint {_prefix(train_dir, 4)}" in caplog.text
    np.testing.assert_array_equal(_weights(_prefix(train_dir, 4)), np.full([4, 3], 40.0))
    assert checkpoints.read_state(train_dir) == [_prefix(train_dir, 2), _prefix(train_dir, 4)]
    assert checkpoints.checkpoint_problem(_prefix(train_dir, 4)) is None


def test_run_training_resumes_from_the_fallback_with_the_same_weights(tmp_path):
    """Damage the newest checkpoint: training redoes its steps and gets them back."""
    train_dir = str(tmp_path / "train")

    def train(max_steps):
        with tf.Graph().as_default():
            graph = tiny_model.build()
            return towerlib.run_training(
                graph, train_dir=train_dir, max_steps=max_steps, save_checkpoint_steps=2,
                session_config=tiny_model.session_config(2), save_summaries_steps=None)

    assert train(4).global_step == 4
    expected = tiny_model.checkpoint_values(_prefix(train_dir, 4))
    with open(_prefix(train_dir, 4) + ".index", "wb") as handle:
        handle.write(b"torn")
    result = train(4)
    assert result.global_step == 4 and result.checkpoint == _prefix(train_dir, 4)
    again = tiny_model.checkpoint_values(_prefix(train_dir, 4))
    for name in expected:
        np.testing.assert_array_equal(again[name], expected[name], err_msg=name)

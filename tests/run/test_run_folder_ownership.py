"""towerlib deletes and overwrites only what it wrote, and never blocks on a run folder.

A run folder may hold what towerlib did not write: a copied state file naming another
folder's checkpoints, links or a user's folders at `best`, `traces` or `.saving`, files
whose names look like leftovers, a forged journal, a hard-linked lock, FIFOs. Each is
left as it is, and refused in one line where towerlib needs the entry. Every call that
could block on a FIFO runs under a deadline, so a regression fails instead of hanging.
"""

import os
import shutil
import threading

import numpy as np
import pytest
import tensorflow as tf

import towerlib
from tests.fault_scripts import tiny_model
from towerlib.run import checkpoints, folder_lock, run_entries

DEADLINE_SECS = 60


def within_deadline(function, *args, **kwargs):
    """function(*args, **kwargs) on a thread; fails the test when it is still running
    after DEADLINE_SECS (a FIFO opened blocking), instead of hanging the suite."""
    outcome = {}

    def target():
        try:
            outcome["value"] = function(*args, **kwargs)
        except BaseException as error:  # pylint: disable=broad-except
            outcome["error"] = error

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(DEADLINE_SECS)
    if thread.is_alive():
        pytest.fail(f"{function.__name__} still blocked after {DEADLINE_SECS} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


@pytest.fixture
def fifo():
    """make(path) plants a FIFO; at the end each is opened from both sides without
    blocking, which releases a thread a regression left blocked on it."""
    made = []

    def make(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.mkfifo(path)
        made.append(path)
        return path

    yield make
    for path in made:
        for flags in (os.O_WRONLY, os.O_RDONLY):
            try:
                os.close(os.open(path, flags | os.O_NONBLOCK))
            except OSError:
                pass


def train(train_dir, max_steps, **options):
    """tiny_model's run; stop_on_signals=() so that it may run on a thread."""
    options.setdefault("save_summaries_steps", None)
    with tf.Graph().as_default():
        return towerlib.run_training(
            tiny_model.build(), train_dir=str(train_dir), max_steps=max_steps,
            session_config=tiny_model.session_config(2), stop_on_signals=(),
            log_every_n_steps=1000, **options)


def one_line(error):
    text = str(error)
    assert "\n" not in text, text
    return text


# --- a state file naming another folder's checkpoints ---


def test_a_copied_state_file_naming_the_original_by_absolute_path_deletes_nothing_there(
        tmp_path, caplog):
    original, copy = tmp_path / "original", tmp_path / "copy"
    train(original, 2, save_checkpoint_steps=2)
    before = sorted(os.listdir(original))
    assert "model.ckpt-0.index" in before and "model.ckpt-2.index" in before
    shutil.copytree(original, copy)
    os.remove(copy / folder_lock.LOCK_FILENAME)
    # TF 1's Saver writes absolute paths: the copy's state names the original's files.
    (copy / "checkpoint").write_text(
        f'model_checkpoint_path: "{original}/model.ckpt-2"\n'
        f'all_model_checkpoint_paths: "{original}/model.ckpt-0"\n'
        f'all_model_checkpoint_paths: "{original}/model.ckpt-2"\n')
    result = train(copy, 6, max_checkpoints_to_keep=1, save_checkpoint_steps=1)
    assert result.global_step == 6 and result.checkpoint == str(copy / "model.ckpt-6")
    assert sorted(os.listdir(original)) == before
    assert f"names {original}/model.ckpt-0, {original}/model.ckpt-2, outside" in caplog.text
    assert caplog.text.count("outside that folder") == 1   # said once, not per read
    assert checkpoints.read_state(str(copy)) == [str(copy / "model.ckpt-6")]


# --- best/ and traces/ ---


def user_folder(path, files):
    path.mkdir(parents=True)
    for name, text in files.items():
        (path / name).write_text(text)
    return {name: text for name, text in files.items()}


def assert_unchanged(path, files):
    assert sorted(os.listdir(path)) == sorted(files)
    for name, text in files.items():
        assert (path / name).read_text() == text


def train_with_evaluation(train_dir, max_steps=2):
    with tf.Graph().as_default():
        train_graph = tiny_model.build()
        features = tf.random.stateless_normal([8, 6], seed=[1, 2])

        def metric(inputs, ctx):
            del ctx
            w = tf.compat.v1.get_variable("hidden/weights")
            return {"score": tf.reduce_sum(w) + 0.0 * inputs[:, 0]}

        evaluation = towerlib.Evaluation(
            towerlib.build_eval_graph(metric, features, num_towers=2, reuse_variables=True),
            every_n_steps=1, metric="score", num_batches=1)
        return towerlib.run_training(
            train_graph, train_dir=str(train_dir), max_steps=max_steps,
            session_config=tiny_model.session_config(2), stop_on_signals=(),
            evaluation=evaluation, save_summaries_steps=None, log_every_n_steps=1000)


def test_best_a_link_to_a_users_folder_is_refused_and_not_written_through(tmp_path):
    mine = tmp_path / "mine"
    files = user_folder(mine, {"checkpoint": 'model_checkpoint_path: "my.ckpt"\n',
                               "notes.txt": "my notes"})
    (tmp_path / "run").mkdir()
    os.symlink(mine, tmp_path / "run" / "best")
    with pytest.raises(run_entries.LinkedEntryError) as raised:
        train_with_evaluation(tmp_path / "run")
    assert f"best -> {mine} is a symbolic link" in one_line(raised.value)
    assert_unchanged(mine, files)


def test_best_a_users_own_folder_or_file_is_refused(tmp_path):
    run = tmp_path / "run"
    files = user_folder(run / "best", {"checkpoint": "mine\n", "notes.txt": "my notes"})
    with pytest.raises(run_entries.ControlEntryError) as raised:
        train_with_evaluation(run)
    assert "a folder towerlib did not write (it holds notes.txt)" in one_line(raised.value)
    assert_unchanged(run / "best", files)
    shutil.rmtree(run)
    run.mkdir()
    (run / "best").write_text("my file")
    with pytest.raises(run_entries.ControlEntryError, match="best is a file, not what"):
        train_with_evaluation(run)
    assert (run / "best").read_text() == "my file"


def test_traces_a_link_to_a_users_folder_is_refused_and_not_written_through(tmp_path):
    mine = tmp_path / "mine"
    files = user_folder(mine, {"trace_step_1.json": "my own trace"})
    (tmp_path / "run").mkdir()
    os.symlink(mine, tmp_path / "run" / "traces")
    with pytest.raises(ValueError) as raised:
        train(tmp_path / "run", 2, trace_steps=[1])
    assert f"traces is a symbolic link to {mine}" in one_line(raised.value)
    assert_unchanged(mine, files)
    os.remove(tmp_path / "run" / "traces")
    files = user_folder(tmp_path / "run" / "traces", {"trace_step_1.json": "mine",
                                                      "notes.txt": "mine"})
    with pytest.raises(ValueError, match="holds files TraceHook does not write"):
        train(tmp_path / "run", 2, trace_steps=[1])
    assert_unchanged(tmp_path / "run" / "traces", files)


# --- leftovers: only what towerlib recorded ---


def test_files_named_like_leftovers_survive_a_start(tmp_path):
    run = tmp_path / "run"
    names = ["results.tempstate7", "draft.tmp" + "0123456789abcdef" * 2,
             "checkpoint.tmp-" + "0123456789abcdef" * 2,
             os.path.join("export-5_temp", "part-00000-of-00001.index")]
    for name in names:
        os.makedirs(os.path.dirname(run / name), exist_ok=True)
        (run / name).write_text("mine")
    train(run, 1)
    for name in names:
        assert (run / name).read_text() == "mine", name


def test_a_users_folder_named_saving_is_refused_not_emptied(tmp_path):
    run = tmp_path / "run"
    files = user_folder(run / checkpoints.SAVING_DIRNAME, {"mine.txt": "mine"})
    with pytest.raises(run_entries.ControlEntryError) as raised:
        train(run, 1)
    assert "a folder towerlib did not write (it holds mine.txt)" in one_line(raised.value)
    assert_unchanged(run / checkpoints.SAVING_DIRNAME, files)


@pytest.mark.parametrize("kind", ["file", "fifo"])
def test_saving_a_file_or_a_fifo_is_refused_in_one_line(tmp_path, kind, fifo):
    run = tmp_path / "run"
    run.mkdir()
    path = run / checkpoints.SAVING_DIRNAME
    path.write_text("mine") if kind == "file" else fifo(str(path))
    with pytest.raises(run_entries.ControlEntryError) as raised:
        within_deadline(train, run, 1)
    assert ".saving is a" in one_line(raised.value) and "Fix: move it away" in str(raised.value)
    if kind == "file":
        assert path.read_text() == "mine"


def test_a_forged_journal_naming_a_users_files_deletes_none(tmp_path):
    run = tmp_path / "run"
    files = {"notes.meta": "mine", "notes.data-00000-of-00001": "mine",
             "model.ckpt-7.data-00000-of-00001": "mine"}
    user_folder(run, files)
    saving = run / checkpoints.SAVING_DIRNAME
    saving.mkdir()
    inode = os.lstat(run / "model.ckpt-7.data-00000-of-00001").st_ino
    (saving / checkpoints.JOURNAL_FILENAME).write_text(
        "notes\n../outside\nnotes.meta\t%d\nmodel.ckpt-7\n"
        "model.ckpt-7.data-00000-of-00001\t%d\n" % (os.lstat(run / "notes.meta").st_ino,
                                                   inode + 1))
    removed = checkpoints.remove_leftovers(str(run))
    assert removed == [str(saving)]
    for name, text in files.items():
        assert (run / name).read_text() == text


# --- the lock file and other control entries of another kind ---


def test_a_hard_linked_lock_file_is_refused_and_not_written(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    mine = tmp_path / "notes.txt"
    mine.write_text("my notes")
    os.link(mine, run / folder_lock.LOCK_FILENAME)
    with pytest.raises(run_entries.ControlEntryError) as raised:
        folder_lock.hold(run)
    assert "a file with 2 hard links" in one_line(raised.value)
    with pytest.raises(run_entries.ControlEntryError):
        train(run, 1)
    assert mine.read_text() == "my notes"


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_a_lock_file_that_is_a_fifo_or_a_folder_is_refused(tmp_path, kind, fifo):
    run = tmp_path / "run"
    run.mkdir()
    path = run / folder_lock.LOCK_FILENAME
    fifo(str(path)) if kind == "fifo" else path.mkdir()
    with pytest.raises(run_entries.ControlEntryError) as raised:
        within_deadline(folder_lock.hold, run)
    assert ".towerlib-lock is a " + ("FIFO" if kind == "fifo" else "folder") in one_line(
        raised.value)


def test_a_state_file_that_is_a_folder_is_refused(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoint").mkdir(parents=True)
    with pytest.raises(run_entries.ControlEntryError) as raised:
        train(run, 1)
    assert "checkpoint is a folder, not what towerlib writes there" in one_line(raised.value)
    assert os.path.isdir(run / "checkpoint")


def test_a_dangling_train_dir_link_is_refused_in_one_line(tmp_path):
    os.symlink(tmp_path / "gone", tmp_path / "run")
    with pytest.raises(run_entries.ControlEntryError) as raised:
        train(tmp_path / "run", 1)
    assert f"is a symbolic link to {tmp_path / 'gone'}, which does not exist" in one_line(
        raised.value)


# --- FIFOs: refused at once, never opened blocking ---


def test_a_fifo_at_the_state_file_is_refused_without_blocking(tmp_path, fifo):
    run = tmp_path / "run"
    fifo(str(run / "checkpoint"))
    with pytest.raises(run_entries.ControlEntryError) as raised:
        within_deadline(checkpoints.prepare_restore, str(run))
    assert "checkpoint is a FIFO (named pipe)" in one_line(raised.value)
    with pytest.raises(run_entries.ControlEntryError):
        within_deadline(train, run, 1)


def test_a_fifo_at_the_journal_is_refused_without_blocking(tmp_path, fifo):
    run = tmp_path / "run"
    fifo(str(run / checkpoints.SAVING_DIRNAME / checkpoints.JOURNAL_FILENAME))
    with pytest.raises(run_entries.ControlEntryError) as raised:
        within_deadline(train, run, 1)
    assert "publishing is a FIFO (named pipe)" in one_line(raised.value)


def test_a_fifo_at_the_best_state_file_is_refused_without_blocking(tmp_path, fifo):
    run = tmp_path / "run"
    fifo(str(run / "best" / "checkpoint"))
    with pytest.raises(run_entries.ControlEntryError) as raised:
        within_deadline(train_with_evaluation, run)
    assert "best/checkpoint is a FIFO (named pipe)" in one_line(raised.value)


# --- run_training's own arguments ---


def test_restore_from_into_a_folder_holding_a_later_step_is_refused(tmp_path):
    other, run = tmp_path / "other", tmp_path / "run"
    train(other, 2, save_checkpoint_steps=2)
    train(run, 4, save_checkpoint_steps=4)
    held = dict(tiny_model.checkpoint_values(str(run / "model.ckpt-4")))
    with pytest.raises(checkpoints.CheckpointError) as raised:
        train(run, 4, restore_from=str(other / "model.ckpt-2"))
    line = one_line(raised.value)
    assert f"restore_from={other}/model.ckpt-2 (global step 2)" in line
    assert f"already holds {run}/model.ckpt-4 (step 4)" in line
    assert "Fix: an empty train_dir" in line and "restore_from='newest'" in line
    for name, value in tiny_model.checkpoint_values(str(run / "model.ckpt-4")).items():
        np.testing.assert_array_equal(value, held[name])
    # Into an empty folder it trains from step 2, as meant.
    result = train(tmp_path / "fresh", 4, restore_from=str(other / "model.ckpt-2"))
    assert result.checkpoint == str(tmp_path / "fresh" / "model.ckpt-4")


@pytest.mark.parametrize("value", ["False", 0, None])
def test_is_chief_must_be_a_bool(tmp_path, value):
    with pytest.raises(towerlib.ConfigError) as raised:
        train(tmp_path / "run", 1, is_chief=value)
    assert f"is_chief: is {value!r}, not True or False" in str(raised.value)
    assert not os.path.exists(tmp_path / "run")

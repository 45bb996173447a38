"""A train_dir holds one run. Flags describing another are refused before anything
is written; a torn newest checkpoint is skipped by train, eval and export alike; every
user error of the train script is one line, exit status 2, nothing half-written."""

import errno
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest
import tensorflow as tf

import towerlib
from examples.cifar10 import default_dirs, generate, job, options, run_errors, run_folder
from examples.cifar10 import eval as eval_lib
from examples.cifar10 import export as export_lib
from towerlib.run import checkpoints

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def data_sets(tmp_path_factory):
    """Two different tiny data sets in the CIFAR-10 format."""
    root = tmp_path_factory.mktemp("data")
    first, second = str(root / "first"), str(root / "second")
    generate.generate(first, train_per_file=20, test_examples=20)
    generate.generate(second, seed=99, train_per_file=20, test_examples=20)
    return first, second


def tiny_config(train_dir, data_dir, **overrides):
    settings = dict(
        train_dir=str(train_dir),
        data_dir=data_dir,
        model="resnet8",
        num_towers=2,
        device_type="cpu",
        global_batch_size=8,
        max_steps=8,
        save_checkpoint_steps=4,
        log_every_n_steps=4,
        seed=3,
    )
    settings.update(overrides)
    return settings  # the train flags given


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, data_sets):
    """A finished 8-step run (checkpoints at 0, 4 and 8) on the first data set."""
    config = tiny_config(tmp_path_factory.mktemp("finished"), data_sets[0])
    job.train(config)
    return config


@pytest.fixture
def run_copy(finished_run, tmp_path):
    train_dir = str(tmp_path / "run")
    shutil.copytree(finished_run["train_dir"], train_dir)
    return train_dir


def _config_bytes(train_dir):
    with open(os.path.join(train_dir, run_folder.CONFIG_FILE), "rb") as f:
        return f.read()


@pytest.mark.slow  # trains the example
def test_another_data_set_is_refused_not_answered_with_the_old_model(run_copy, data_sets):
    before = _config_bytes(run_copy)
    with pytest.raises(
        options.FlagError,
        match=r"holds another run .*recorded --data_dir=\S+first, flags --data_dir=\S+"
        r"second.*Fix: a new --train_dir.*--overwrite_train_dir",
    ):
        job.train(tiny_config(run_copy, data_sets[1]))
    assert _config_bytes(run_copy) == before


@pytest.mark.slow  # trains the example
def test_resuming_an_sgd_run_with_momentum_is_refused_in_one_line(tmp_path, data_sets):
    train_dir = tmp_path / "sgd"
    job.train(tiny_config(train_dir, data_sets[0], optimizer="sgd", max_steps=4))
    before = _config_bytes(train_dir)
    with pytest.raises(options.FlagError) as error:
        job.train(tiny_config(train_dir, data_sets[0], optimizer="momentum"))
    assert "recorded --optimizer=sgd, flags --optimizer=momentum" in str(error.value)
    assert "\n" not in str(error.value)
    assert _config_bytes(train_dir) == before


@pytest.mark.slow  # trains the example
def test_overwrite_train_dir_starts_over(run_copy, data_sets):
    result = job.train(
        tiny_config(run_copy, data_sets[1], max_steps=4, overwrite_train_dir=True)
    )
    assert (result.start_step, result.global_step) == (0, 4)
    assert run_folder.load(run_copy).data_dir == data_sets[1]
    assert not os.path.exists(os.path.join(run_copy, "model.ckpt-8.index"))


@pytest.mark.slow  # trains the example
def test_without_a_config_file_a_wrong_model_is_refused_before_writing(run_copy, data_sets):
    os.remove(os.path.join(run_copy, run_folder.CONFIG_FILE))
    with pytest.raises(options.FlagError, match=r"is of another model or optimizer"):
        job.train(tiny_config(run_copy, data_sets[0], model="convnet", max_steps=12))
    assert not os.path.exists(os.path.join(run_copy, run_folder.CONFIG_FILE))
    # The right model still resumes the run (it was not recorded as convnet).
    result = job.train(tiny_config(run_copy, data_sets[0], max_steps=12))
    assert (result.start_step, result.global_step) == (8, 12)


@pytest.mark.slow  # trains the example
def test_a_torn_newest_index_is_skipped_by_train_eval_and_export(run_copy, data_sets, caplog):
    with open(os.path.join(run_copy, "model.ckpt-8.index"), "r+b") as f:
        f.truncate(500)
    assert tf.train.latest_checkpoint(run_copy).endswith("model.ckpt-8")  # still named
    assert run_folder.checkpoint_step(run_copy) == 4
    assert eval_lib.evaluate_latest(run_copy, num_towers=1).global_step == 4
    caplog.set_level("INFO", logger="towerlib")
    assert export_lib.export(run_copy).endswith(os.sep + "4")
    # 0.9^4 = 0.66 of batch norm's moving statistics are still their initial values.
    assert any(m.startswith("The export of step 4 uses batch-norm moving statistics that "
                            "are still 66% their initial values") for m in caplog.messages)
    caplog.set_level("INFO", logger="cifar10")
    result = job.train(tiny_config(run_copy, data_sets[0]))
    assert (result.start_step, result.global_step) == (4, 8)
    assert "Resuming from the checkpoint in %s at global step 4." % run_copy in (
        caplog.messages
    )


@pytest.mark.slow  # trains the example
def test_a_full_disk_names_the_folder_and_the_last_complete_checkpoint(
    run_copy, data_sets, monkeypatch
):
    real_stage = checkpoints.CheckpointWriter._stage

    def stage_until_full(self, session, step):
        if step >= 12:
            raise tf.errors.ResourceExhaustedError(None, None, "No space left on device")
        return real_stage(self, session, step)

    monkeypatch.setattr(checkpoints.CheckpointWriter, "_stage", stage_until_full)
    with pytest.raises(run_errors.RunError) as error:
        job.train(tiny_config(run_copy, data_sets[0], max_steps=16))
    message = str(error.value)
    assert "No space left on the device of --train_dir=%r" % run_copy in message
    assert "the last complete checkpoint is %s/model.ckpt-8" % run_copy in message
    assert "\n" not in message


def test_a_disk_full_oserror_is_one_line_too(tmp_path):
    with pytest.raises(run_errors.RunError, match="No space left.*no complete checkpoint"):
        with run_errors.one_line_errors(str(tmp_path)):
            raise OSError(errno.ENOSPC, "No space left on device")


def test_a_non_finite_loss_names_the_checkpoint_to_resume_from(tmp_path):
    failure = towerlib.NonFiniteError(
        5, ["tower 1 (/device:CPU:1): the loss is NaN or Inf"], applied=False,
        last_checkpoint="/runs/a/model.ckpt-4")
    with pytest.raises(run_errors.RunError) as error:
        with run_errors.one_line_errors(str(tmp_path)):
            raise failure
    message = str(error.value)
    assert "at step 5" in message and "/runs/a/model.ckpt-4" in message
    assert "rerun the same command to resume from it" in message and "\n" not in message


def test_the_default_train_dir_is_per_user_and_per_clone(monkeypatch):
    here = default_dirs.default_train_dir("main")
    assert not here.startswith("/tmp/cifar10")
    assert "main-%s-" % default_dirs._user() in here
    monkeypatch.setattr(default_dirs, "_CLONE", "/somewhere/else/towerlib")
    assert default_dirs.default_train_dir("main") != here
    assert options.train_defaults()["train_dir"] != here


@pytest.mark.slow  # the train script in a fresh process, once per case
@pytest.mark.parametrize(
    "case, args, expected",
    [
        ("fresh", ["--save_checkpoint_steps=0"], "--save_checkpoint_steps=0: must be an int"),
        ("file", [], "exists and is not a directory"),
        ("unwritable", [], "--train_dir=/proc/1/towerlib_run: /proc/1/towerlib_run cannot"),
        ("fresh", ["--learning_rate=inf"], "learning_rate must be a positive finite number"),
        ("fresh", ["--learning_rate=1e9"], "learning rate must be at most 10"),
        ("fresh", ["--momentum=5"], "--momentum=5: use a value in [0, 1)"),
        ("fresh", ["--weight_decay=inf"], "--weight_decay=inf: use a finite value >= 0"),
    ],
)
def test_train_script_errors_are_one_line_and_write_nothing(
    tmp_path, data_sets, case, args, expected
):
    train_dir = {
        "fresh": str(tmp_path / "run"),
        "file": str(tmp_path / "a_file"),
        "unwritable": "/proc/1/towerlib_run",
    }[case]
    if case == "file":
        with open(train_dir, "w") as f:
            f.write("not a folder")
    completed = subprocess.run(
        [sys.executable, "-m", "examples.cifar10.train", "--train_dir=" + train_dir,
         "--data_dir=" + data_sets[0], "--max_steps=2"] + args,
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
    )
    assert completed.returncode == 2, completed.stderr[-2000:]
    # TensorFlow's start-up lines aside (TF_CPP_MIN_LOG_LEVEL=2 here), one error line,
    # the last.
    lines = completed.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("error")]
    assert errors == lines[-1:], completed.stderr[-2000:]
    assert expected in errors[0]
    assert "Traceback" not in completed.stderr
    if case == "fresh":
        assert not os.path.exists(train_dir)


def test_a_folder_another_trainer_holds_is_refused_in_one_line(tmp_path):
    from towerlib.run import folder_lock

    held = folder_lock.hold(tmp_path)
    try:
        flags = options.namespace(dict(options.train_defaults(), train_dir=str(tmp_path)))
        with pytest.raises(run_errors.RunError, match=r"is in use: process pid \d+ on \S+ "
                           r"is training into it.*Fix: wait for it"):
            run_folder.record(flags, "", 8)
        assert not os.path.exists(os.path.join(tmp_path, run_folder.CONFIG_FILE))
        with pytest.raises(run_errors.RunError), run_errors.one_line_errors(str(tmp_path)):
            folder_lock.hold(tmp_path)
    finally:
        held.release()


USER_FILES = ["export/my_model/saved_model.pb", "checkpoints/best.h5", "eval/results.csv",
              "checkpoint_notes.txt", "model.ckpt-7.data-00000-of-00001",
              "checkpoint.tmp_notes", "checkpoint.tmp.keep", "traces/notes.txt"]


def _write(folder, names, text="mine"):
    for name in names:
        path = os.path.join(folder, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)


def _all_intact(folder, names):
    for name in names:
        with open(os.path.join(folder, name)) as f:
            assert f.read() == "mine", name


def test_overwrite_refuses_a_folder_that_was_never_a_run(tmp_path):
    # These four were deleted, and the script exited 0.
    _write(str(tmp_path), USER_FILES)
    with pytest.raises(options.FlagError) as raised:
        run_folder.start_over(str(tmp_path))
    message = str(raised.value)
    assert "\n" not in message and "holds no train_config.json" in message
    assert "nothing was deleted" in message and "Fix: another --train_dir" in message
    _all_intact(str(tmp_path), USER_FILES)


# Event files and traces a life of the run writes (recorded by run_folder.claiming): an
# event file names the second it was opened and this host.
_NOW, _HOST = int(time.time()) + 3600, socket.gethostname()  # not before any life
RUN_EVENTS = [f"events.out.tfevents.{_NOW}.{_HOST}", f"eval/events.out.tfevents.{_NOW}.{_HOST}",
              "traces/trace_step_5.json"]
# A user's files of the same formats, there before the run's life began.
USER_EVENTS = ["events.out.tfevents.mine", "events.out.tfevents.1700000000.otherhost",
               "eval/events.out.tfevents.1700000001.otherhost", "traces/trace_step_1.png"]


def test_overwrite_of_a_run_removes_only_what_the_run_wrote(tmp_path):
    ours = [run_folder.CONFIG_FILE, "checkpoint", "model.ckpt-8.index", "model.ckpt-8.meta",
            "model.ckpt-8.data-00000-of-00001",
            "export/8/saved_model.pb", "export/8/variables/variables.index",
            ".saving/model.ckpt-9.index", ".saving/checkpoint.tmp-" + "ab" * 16]
    _write(str(tmp_path), ours + USER_FILES + USER_EVENTS)
    run_folder.record_written(str(tmp_path), ["export/8"])   # as export.py records it
    _write(str(tmp_path), ["generated_data/cifar-10-batches-bin/data_batch_1.bin"])
    with run_folder.claiming(str(tmp_path)):   # one life of the run
        _write(str(tmp_path), RUN_EVENTS)
    assert run_folder.written_files(str(tmp_path)) == set(RUN_EVENTS) | {"export/8"}
    run_folder.start_over(str(tmp_path))
    for name in ours + RUN_EVENTS + [run_folder.RUN_FILES]:
        assert not os.path.exists(os.path.join(tmp_path, name)), name
    assert not os.path.exists(os.path.join(tmp_path, "export", "8"))
    _all_intact(str(tmp_path), USER_FILES + USER_EVENTS
                + ["generated_data/cifar-10-batches-bin/data_batch_1.bin"])


def test_overwrite_keeps_a_users_export_version_and_never_follows_a_link(tmp_path):
    """A user's TF-Serving version folder export/1/ has the shape of an export; only the
    record says which versions a run wrote. A linked export/2 is not followed, and the
    checks all come before the first deletion."""
    saved_model = ["saved_model.pb", "variables/variables.index"]
    _write(str(tmp_path), [run_folder.CONFIG_FILE, "model.ckpt-8.index"]
           + [f"export/8/{n}" for n in saved_model] + [f"export/1/{n}" for n in saved_model])
    run_folder.record_written(str(tmp_path), ["export/8"])
    theirs = tmp_path / "their_model"
    _write(str(theirs), saved_model)
    os.symlink(theirs, tmp_path / "export" / "2")
    deleted = run_folder.start_over(str(tmp_path))
    assert "export/8" in deleted and not os.path.exists(tmp_path / "export" / "8")
    _all_intact(str(tmp_path), [f"export/1/{n}" for n in saved_model])
    _all_intact(str(theirs), saved_model)
    assert os.path.islink(tmp_path / "export" / "2")
    assert not os.path.exists(tmp_path / run_folder.STARTING_OVER)


def test_an_event_file_the_run_did_not_record_is_never_deleted(tmp_path):
    """A name that fits TensorFlow's format is not enough: only a life's record counts.
    (A user's events.out.tfevents.mine, kept with six other files, was deleted.)"""
    _write(str(tmp_path), [run_folder.CONFIG_FILE, "model.ckpt-8.index"])
    _write(str(tmp_path), USER_EVENTS + USER_FILES[:6])
    with run_folder.claiming(str(tmp_path)):
        _write(str(tmp_path), RUN_EVENTS[:1])
    _write(str(tmp_path), ["events.out.tfevents.1795850009.host"])   # after that life
    deleted = run_folder.start_over(str(tmp_path))
    assert RUN_EVENTS[0] in deleted and "events.out.tfevents.1795850009.host" not in deleted
    _all_intact(str(tmp_path), USER_EVENTS + USER_FILES[:6]
                + ["events.out.tfevents.1795850009.host"])


@pytest.mark.slow  # trains the example
def test_overwrite_of_a_trained_run_keeps_a_users_event_files(run_copy, data_sets):
    run_events = run_folder.written_files(run_copy)
    assert any(name.startswith("events.out.tfevents.") for name in run_events), run_events
    _write(run_copy, USER_EVENTS + USER_FILES[:6])
    job.train(tiny_config(run_copy, data_sets[0], max_steps=2, overwrite_train_dir=True))
    assert not any(os.path.exists(os.path.join(run_copy, n)) for n in run_events)
    _all_intact(run_copy, USER_EVENTS + USER_FILES[:6])
    assert run_folder.written_files(run_copy) and \
        not run_folder.written_files(run_copy) & run_events   # the new life's, recorded


def test_overwrite_of_an_empty_or_missing_folder_is_nothing(tmp_path):
    assert run_folder.start_over(str(tmp_path / "absent")) == []
    assert run_folder.start_over(str(tmp_path)) == []


@pytest.mark.slow  # the train script in a fresh process
def test_the_train_script_refuses_to_overwrite_a_folder_of_user_files(tmp_path, data_sets):
    train_dir = str(tmp_path / "mine")
    _write(train_dir, USER_FILES)
    completed = subprocess.run(
        [sys.executable, "-m", "examples.cifar10.train", "--train_dir=" + train_dir,
         "--data_dir=" + data_sets[0], "--max_steps=2", "--overwrite_train_dir"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert completed.returncode == 2, completed.stderr[-2000:]
    lines = completed.stderr.strip().splitlines()
    assert lines[-1].startswith("error: --overwrite_train_dir: ") and \
        "holds no train_config.json" in lines[-1], completed.stderr[-2000:]
    assert "Traceback" not in completed.stderr
    _all_intact(train_dir, USER_FILES)
    assert sorted(os.listdir(train_dir)) == sorted(
        {name.split("/")[0] for name in USER_FILES})


def test_an_event_file_copied_in_during_a_life_is_not_claimed(tmp_path):
    """Another host's, or an older one, that appears while the run writes stays the user's."""
    copied = ["events.out.tfevents.1700000000.otherhost",
              f"events.out.tfevents.{_NOW}.otherhost", "events.out.tfevents.1700000000." + _HOST]
    with run_folder.claiming(str(tmp_path)):
        _write(str(tmp_path), RUN_EVENTS[:1] + copied)
    assert run_folder.written_files(str(tmp_path)) == set(RUN_EVENTS[:1])


def test_a_checkpoint_of_another_input_is_refused_in_one_line_before_the_record(tmp_path):
    """A ps cluster's checkpoint (or an older example's) has no global-batch position:
    refused before train_config.json is rewritten, naming the input, not the model."""
    import numpy as np

    with tf.Graph().as_default():
        weights = tf.compat.v1.get_variable("w", [2])
        with tf.compat.v1.Session() as session:
            session.run(weights.initializer)
            prefix = tf.compat.v1.train.Saver().save(session, str(tmp_path / "model.ckpt"))
    with tf.Graph().as_default():
        tf.compat.v1.get_variable("w", [2])
        towerlib.global_batch_input(np.zeros([4, 2], np.float32), 2, seed=0)
        with pytest.raises(options.FlagError, match="written with another input") as raised:
            run_folder.check_checkpoint_fits_graph(prefix, str(tmp_path))
    assert "\n" not in str(raised.value) and "Fix:" in str(raised.value)

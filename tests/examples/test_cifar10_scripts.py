"""The example's scripts: every user error is one line and exit status 2, a
resumed run takes its flags from train_config.json, export deletes nothing it did not
write, a read-only run folder is evaluated (and refused for export) in one line, a short
run evaluates above chance, and the first log line states a constant learning rate."""

import contextlib
import os
import shutil
import subprocess
import sys

import pytest
import tensorflow as tf

from examples.cifar10 import eval as eval_lib
from examples.cifar10 import export as export_lib
from examples.cifar10 import generate, job, options, planning, run_folder
from tests.examples.test_cifar10_config import check

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY_STEPS = 4


def _script(name, args, timeout=300):
    """`python -m examples.cifar10.<name> args` from the repository root."""
    return subprocess.run(
        [sys.executable, "-m", "examples.cifar10." + name] + [str(a) for a in args],
        cwd=REPO_ROOT, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
        capture_output=True, text=True, timeout=timeout)


def _one_error_line(completed):
    """The script's only error line; it failed with status 2 and no traceback."""
    assert completed.returncode == 2, completed.stderr[-3000:]
    assert "Traceback" not in completed.stderr, completed.stderr[-3000:]
    errors = [line for line in completed.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, completed.stderr[-3000:]
    assert "FATAL" not in completed.stderr and "USAGE" not in completed.stderr
    return errors[0]


@contextlib.contextmanager
def read_only(folder):
    """`folder` cannot be written in, for this user and for root (chattr +i) alike."""
    folder = str(folder)
    if os.geteuid() == 0:
        if not shutil.which("chattr") or subprocess.run(
                ["chattr", "+i", folder], capture_output=True).returncode:
            pytest.skip("root, and chattr +i does not work here: cannot make a folder "
                        "read-only")
        undo = lambda: subprocess.run(["chattr", "-i", folder], check=True)  # noqa: E731
    else:
        mode = os.stat(folder).st_mode
        os.chmod(folder, 0o555)
        undo = lambda: os.chmod(folder, mode)  # noqa: E731
    try:
        probe = os.path.join(folder, ".probe")
        try:
            open(probe, "w").close()
        except OSError:
            pass
        else:
            os.remove(probe)
            pytest.skip("%s is still writable" % folder)
        yield folder
    finally:
        undo()


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    """200 training and 50 test examples in the CIFAR-10 file format."""
    folder = str(tmp_path_factory.mktemp("tiny_data"))
    generate.generate(folder, train_per_file=40, test_examples=50)
    return folder


def _tiny_flags(train_dir, data_dir, **overrides):
    flags = dict(train_dir=str(train_dir), data_dir=data_dir, model="resnet8", num_towers=2,
                 device_type="cpu", global_batch_size=16, max_steps=TINY_STEPS,
                 save_checkpoint_steps=TINY_STEPS, seed=5)
    flags.update(overrides)
    return flags


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, tiny_data):
    """A finished 4-step run of resnet8 on 2 CPU towers (no eval/ or export/ folder)."""
    train_dir = tmp_path_factory.mktemp("tiny_run") / "run"
    job.train(_tiny_flags(train_dir, tiny_data))
    return str(train_dir)


@pytest.fixture
def run_copy(tiny_run, tmp_path):
    copy = str(tmp_path / "run")
    shutil.copytree(tiny_run, copy)
    return copy


def _fake_run(train_dir, step=7):
    """A run folder with a train_config.json and a checkpoint holding only global_step:
    enough for export's checks, which come before any model is built."""
    flags = run_folder.resolve_flags({"train_dir": str(train_dir), "model": "resnet8"})
    run_folder.record(flags, "", step)
    with tf.Graph().as_default():
        global_step = tf.compat.v1.train.get_or_create_global_step()
        with tf.compat.v1.Session() as session:
            session.run(global_step.initializer)
            session.run(global_step.assign(step))
            tf.compat.v1.train.Saver().save(
                session, os.path.join(str(train_dir), "model.ckpt"), global_step=step)
    return str(train_dir)


# --- export never deletes what it did not write (fast) ------------------------------


def test_export_refuses_a_step_folder_holding_files_it_did_not_write(tmp_path):
    train_dir = _fake_run(tmp_path / "run")
    step_dir = tmp_path / "exports" / "7"
    (step_dir / "variables").mkdir(parents=True)
    (step_dir / "saved_model.pb").write_bytes(b"model")
    (step_dir / "notes.txt").write_text("mine")
    with pytest.raises(options.FlagError) as error:
        export_lib.export(train_dir, str(tmp_path / "exports"))
    message = str(error.value)
    assert "notes.txt" in message and "--overwrite" in message and "--export_dir" in message
    assert "\n" not in message
    assert (step_dir / "notes.txt").read_text() == "mine"  # nothing deleted
    assert (step_dir / "saved_model.pb").read_bytes() == b"model"


def test_only_a_savedmodels_files_count_as_an_earlier_export(tmp_path):
    (tmp_path / "variables").mkdir()
    for name in ("saved_model.pb", "variables/variables.index",
                 "variables/variables.data-00000-of-00001"):
        (tmp_path / name).write_bytes(b"x")
    assert export_lib.foreign_files(str(tmp_path)) == []
    export_lib.check_replaceable(str(tmp_path), overwrite=False)  # an export: replaceable
    (tmp_path / "assets").mkdir()
    (tmp_path / "variables" / "mine.txt").write_text("mine")
    assert export_lib.foreign_files(str(tmp_path)) == ["assets/", "variables/mine.txt"]
    export_lib.check_replaceable(str(tmp_path), overwrite=True)


def test_export_to_a_regular_file_is_one_line(tmp_path):
    train_dir = _fake_run(tmp_path / "run")
    a_file = tmp_path / "a_file"
    a_file.write_text("not a folder")
    with pytest.raises(options.FlagError, match=r"^--export_dir=\S+a_file: .*exists and is "
                       r"not a directory.*Fix: a folder this user can write"):
        export_lib.export(train_dir, str(a_file))
    assert a_file.read_text() == "not a folder"


# --- a read-only run folder (fast: the checks alone) -------------------------------


def test_eval_without_eval_dir_skips_the_summary_of_a_read_only_run(tmp_path, caplog):
    caplog.set_level("INFO", logger="cifar10")
    with read_only(tmp_path) as folder:
        assert eval_lib.summary_dir(folder) is None
        assert any("NOTE: " in m and "not writable" in m and "--eval_dir=" in m
                   and "without writing the precision_at_1 summary" in m
                   for m in caplog.messages), caplog.messages
        with pytest.raises(options.FlagError, match=r"^--eval_dir=\S+: .*not writable"):
            eval_lib.summary_dir(folder, os.path.join(folder, "eval"))
        with pytest.raises(options.FlagError, match=r"^--export_dir=\S+/export \(the default\)"
                           r": .*Fix: a folder this user can write"):
            export_lib.check_export_dir(os.path.join(folder, "export"), given=False)
    assert eval_lib.summary_dir(str(tmp_path)) == str(tmp_path / "eval")


# --- --device_type=gpu without GPUs (fast) -----------------------------------------


@pytest.mark.skipif(bool(tf.config.list_physical_devices("GPU")), reason="needs no GPU")
@pytest.mark.parametrize("towers", [{}, {"num_towers": 2}])
def test_gpu_without_gpus_suggests_a_value_the_script_takes(tmp_path, towers):
    args = dict(train_dir=str(tmp_path / "run"), device_type="gpu", **towers)
    with pytest.raises(options.FlagError) as error:
        check(args)
    message = str(error.value)
    assert message.startswith("--device_type=gpu: ") and "device_type='cpu'" in message
    assert "<= 0" not in message  # --num_towers takes 0 (one per GPU) but not below
    check(dict(args, device_type="cpu"))  # the suggestion works


# --- a resume takes the flags it is not given from train_config.json (fast) --------


def test_a_resume_needs_only_the_flags_that_change(tmp_path, tiny_data):
    run = _tiny_flags(tmp_path / "run", tiny_data, train_epochs=3, lr_decay_epochs=[2],
                      bn_mode="all_towers")
    recorded = run_folder.resolve_flags(run)
    run_folder.record(recorded, tiny_data, 38)
    resumed = run_folder.resolve_flags({"train_dir": run["train_dir"], "max_steps": 60})
    for name in ("data_dir", "model", "num_towers", "device_type", "global_batch_size",
                 "bn_mode", "lr_decay_epochs", "seed"):
        assert getattr(resumed, name) == getattr(recorded, name), name
    assert (resumed.max_steps, resumed.train_epochs) == (60, 0.0)  # --max_steps is given
    again = run_folder.resolve_flags({"train_dir": run["train_dir"]})
    assert (again.max_steps, again.train_epochs) == (38, 3.0)
    with pytest.raises(options.FlagError, match=r"recorded --num_towers=2, flags "
                       r"--num_towers=1\)\. Fix: a new --train_dir"):
        run_folder.resolve_flags({"train_dir": run["train_dir"], "num_towers": 1})
    # Flags that may change between the lives of a run are taken as given.
    assert run_folder.resolve_flags(
        {"train_dir": run["train_dir"], "log_every_n_steps": 7}).log_every_n_steps == 7


# --- the first log line (fast) -----------------------------------------------------


def test_the_first_log_line_states_a_constant_learning_rate(tmp_path, tiny_data):
    line = planning.describe(job.plan_run(_tiny_flags(tmp_path / "a", tiny_data)))
    assert "learning rate 0.01 (momentum), constant (no --lr_decay_epochs)" in line
    assert "none" not in line
    line = planning.describe(job.plan_run(
        _tiny_flags(tmp_path / "b", tiny_data, lr_decay_epochs=[2], train_epochs=3)))
    assert "learning rate 0.01 (momentum) with decays x0.1 after steps [25];" in line


# --- absl's flag errors, one line and status 2 in every script (slow) --------------


@pytest.mark.slow  # a fresh process per case
@pytest.mark.parametrize("script, args, expected", [
    ("train", ["--num_tower=2"], "error: Unknown command line flag 'num_tower'. Did you "
     "mean: num_towers? See --helpshort"),
    ("train", ["--seed=abc"], "error: flag --seed=abc: invalid literal for int()"),
    ("train", ["--accumulation_steps=2.5"], "error: flag --accumulation_steps=2.5: "),
    ("train", ["two", "words"], "error: unexpected arguments two words: every setting is "
     "a --flag"),
    ("eval", ["--num_tower=2"], "error: Unknown command line flag 'num_tower'"),
    ("export", ["extra"], "error: unexpected arguments extra"),
    ("main", ["--seed=abc"], "error: flag --seed=abc: "),
])
def test_flag_errors_are_one_line_and_status_2(tmp_path, script, args, expected):
    completed = _script(script, ["--train_dir=%s" % (tmp_path / "run")] + args)
    assert _one_error_line(completed).startswith(expected), completed.stderr[-3000:]
    assert not (tmp_path / "run").exists()


# --- items 1, 15 and 23 through the scripts (slow) ------------------------------------------


@pytest.mark.slow  # the scripts in fresh processes, on a trained run
def test_a_read_only_run_folder_is_evaluated_and_refused_for_export(run_copy, tmp_path):
    with read_only(run_copy):
        evaluated = _script("eval", ["--train_dir=%s" % run_copy])
        assert evaluated.returncode == 0, evaluated.stderr[-3000:]
        assert "precision@1 = " in evaluated.stderr and "Traceback" not in evaluated.stderr
        assert "without writing the precision_at_1 summary" in evaluated.stderr
        line = _one_error_line(_script(
            "eval", ["--train_dir=%s" % run_copy, "--eval_dir=%s/eval" % run_copy]))
        assert line.startswith("error: --eval_dir=%s/eval: " % run_copy)
        line = _one_error_line(_script("export", ["--train_dir=%s" % run_copy]))
        assert line.startswith("error: --export_dir=%s/export (the default): " % run_copy)
        assert "Fix: a folder this user can write" in line
    a_file = tmp_path / "a_file"
    a_file.write_text("not a folder")
    line = _one_error_line(_script(
        "export", ["--train_dir=%s" % run_copy, "--export_dir=%s" % a_file]))
    assert line.startswith("error: --export_dir=%s: " % a_file)


@pytest.mark.slow  # the export script in fresh processes, on a trained run
def test_export_replaces_only_its_own_export(tiny_run, tmp_path):
    exports = tmp_path / "exports"
    step_dir = exports / str(TINY_STEPS)
    step_dir.mkdir(parents=True)
    (step_dir / "notes.txt").write_text("mine")
    args = ["--train_dir=%s" % tiny_run, "--export_dir=%s" % exports]
    line = _one_error_line(_script("export", args))
    assert "notes.txt" in line and "--overwrite" in line
    assert (step_dir / "notes.txt").read_text() == "mine"
    replaced = _script("export", args + ["--overwrite"])
    assert replaced.returncode == 0, replaced.stderr[-3000:]
    assert not (step_dir / "notes.txt").exists()
    assert (step_dir / "saved_model.pb").is_file()
    again = _script("export", args)  # its own export of that step: replaced
    assert again.returncode == 0, again.stderr[-3000:]


@pytest.mark.slow  # the train script in fresh processes, on a trained run
def test_the_train_script_resumes_with_train_dir_and_max_steps_alone(run_copy):
    resumed = _script("train", ["--train_dir=%s" % run_copy, "--max_steps=6"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Training resnet8 on 2 tower(s)" in resumed.stderr
    assert "Trained from global step %d to 6" % TINY_STEPS in resumed.stderr
    line = _one_error_line(_script("train", ["--train_dir=%s" % run_copy, "--num_towers=1"]))
    assert "recorded --num_towers=2, flags --num_towers=1" in line


# --- a short run with the default flags evaluates above chance (slow) -------------


@pytest.mark.slow  # trains 40 steps of the convnet
def test_a_short_run_with_the_default_flags_evaluates_above_chance(tmp_path):
    flags = dict(train_dir=str(tmp_path / "run"), max_steps=40, num_towers=2,
                 device_type="cpu", seed=1)
    job.train(flags)  # the train script's defaults otherwise: the generated data
    result = eval_lib.evaluate_latest(flags["train_dir"])
    assert result.precision_at_1 > 0.3, result  # chance is 0.1

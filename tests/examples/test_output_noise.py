"""The example scripts' normal output is clean, and a real error still
shows. TensorFlow's start-up lines (filtered out of `import tensorflow` unless the user set
TF_CPP_MIN_LOG_LEVEL), the two deprecation warnings of the calls the example makes on
purpose, the SavedModel loader's "Fingerprint not found", --help before TensorFlow loads,
and the distributed example's doubled INFO lines and C++ log."""

import importlib
import logging
import os
import re
import subprocess
import sys
import textwrap

import pytest

from examples.cifar10 import command_line, generate, options, quiet_tensorflow, script_runner

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Each noise source, as it appears in the output.
NOISE = (
    "absl::InitializeLog",
    "oneDNN custom operations are on",
    "Could not find cuda drivers",
    "cuInit",
    "make_saveable_from_iterator",
    "build_tensor_info",
    "Fingerprint not found",
    "path_and_singleprint",
    "INFO:tensorflow:",
    "Local rendezvous is aborting",
)
# The start-up lines as TensorFlow 2.21 prints them (copied from a CPU machine's stderr).
STARTUP_LINES = (
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "I0000 00:00:1795566598.137010   22924 port.cc:153] oneDNN custom operations are on. You "
    "may see slightly different numerical results due to floating-point round-off errors "
    "from different computation orders. To turn them off, set the environment variable "
    "`TF_ENABLE_ONEDNN_OPTS=0`.",
    "I0000 00:00:1795566598.137369   22924 cudart_stub.cc:31] Could not find cuda drivers on "
    "your machine, GPU will not be used.",
)


def noise_lines(text):
    return [line for line in text.splitlines() if any(n in line for n in NOISE)]


def _environ(**changes):
    """This environment without TF_CPP_MIN_LOG_LEVEL (as a user's shell), with `changes`."""
    environ = {k: v for k, v in os.environ.items() if k != quiet_tensorflow.LEVEL_VARIABLE}
    environ.pop("TF_CONFIG", None)
    environ["PYTHONPATH"] = REPO_ROOT + os.pathsep + environ.get("PYTHONPATH", "")
    environ.update(changes)
    return environ


def _python(args, environ=None, timeout=300):
    return subprocess.run([sys.executable] + list(args), cwd=REPO_ROOT,
                          env=environ or _environ(), capture_output=True, text=True,
                          timeout=timeout)


# --- fast ------------------------------------------------------------------------------------


def test_only_tensorflows_startup_lines_are_recognized():
    assert all(quiet_tensorflow.is_startup_line(line) for line in STARTUP_LINES)
    for line in (
        "E0000 00:00:1795567062.045188   31697 cuda_platform.cc:52] failed call to cuInit: "
        "INTERNAL: CUDA error",
        "W0000 00:00:1795566598.137010   22924 port.cc:153] oneDNN custom operations are on.",
        "I0000 00:00:1795566598.137010   22924 port.cc:153] something else",
        "F0000 00:00:1795566598.137010   22924 cudart_stub.cc:31] Check failed",
        "Illegal instruction (core dumped)",
        "ImportError: libcudart.so.12: cannot open shared object file",
        "error: Unknown command line flag 'num_tower'",
    ):
        assert not quiet_tensorflow.is_startup_line(line), line


def test_the_filter_is_off_when_the_user_set_a_level_or_tensorflow_is_loaded():
    try:
        assert not quiet_tensorflow.filter_startup_lines(True, modules={})
        assert not quiet_tensorflow.filter_startup_lines(False, modules={"tensorflow": 1})
        assert not any(isinstance(f, quiet_tensorflow._StartupLineFilter)
                       for f in sys.meta_path)
        assert quiet_tensorflow.filter_startup_lines(False, modules={})
        assert quiet_tensorflow.filter_startup_lines(False, modules={})  # still one
        assert sum(isinstance(f, quiet_tensorflow._StartupLineFilter)
                   for f in sys.meta_path) == 1
    finally:
        quiet_tensorflow.uninstall_filter()
    assert not any(isinstance(f, quiet_tensorflow._StartupLineFilter) for f in sys.meta_path)


def _deprecation_record(function, level=logging.WARNING):
    # The format of tensorflow/python/util/deprecation.py's warning.
    return logging.LogRecord(
        "tensorflow", level, "deprecation.py", 377,
        "From %s: %s (from %s) is deprecated and will be removed %s.\n"
        "Instructions for updating:\n%s",
        ("/somewhere/data_position.py:104", function,
         "tensorflow.python.data.experimental.ops.iterator_ops", "in a future version",
         "Use something else."), None)


def test_exactly_the_two_known_deprecation_warnings_are_dropped():
    known = script_runner.KnownDeprecationFilter()
    for function in ("make_saveable_from_iterator", "build_tensor_info"):
        assert not known.filter(_deprecation_record(function))
    for function in ("SyncReplicasOptimizer.__init__", "QueueRunner.__init__",
                     "make_saveable_from_iterator_v2", "my_build_tensor_info"):
        assert known.filter(_deprecation_record(function)), function
    other = logging.LogRecord("tensorflow", logging.WARNING, "x.py", 1,
                              "make_saveable_from_iterator failed: disk full", (), None)
    assert known.filter(other)


def test_the_deprecation_filter_is_scoped_to_the_call(caplog):
    logger = logging.getLogger("test_output_noise.tf")
    with caplog.at_level(logging.WARNING, logger=logger.name):
        with script_runner.known_deprecations_silenced(logger):
            logger.handle(_deprecation_record("build_tensor_info"))
            logger.warning("a real warning")
        logger.handle(_deprecation_record("build_tensor_info"))
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0] == "a real warning"
    assert len(messages) == 2 and "build_tensor_info" in messages[1]
    assert not logger.filters


def test_only_the_loaders_two_fingerprint_notes_are_dropped_while_loading(caplog):
    from examples.cifar10 import main

    absl_logger = logging.getLogger("absl")
    with caplog.at_level(logging.INFO, logger="absl"):
        with main.without_fingerprint_notes():
            for note in main.NO_FINGERPRINT_NOTES:
                absl_logger.info(note)
            absl_logger.info("Fingerprint was found, but there was an error")
        absl_logger.info(main.NO_FINGERPRINT_NOTES[0])
    assert [r.getMessage() for r in caplog.records] == [
        "Fingerprint was found, but there was an error", main.NO_FINGERPRINT_NOTES[0]]


@pytest.mark.parametrize("argv, asks", [
    (["x", "--help"], True), (["x", "-help"], True), (["x", "--helpfull"], True),
    (["x", "--helpshort"], True), (["x", "-?"], True), (["x", "--help=true"], True),
    (["x", "--num_towers=2", "--helpxml"], True), (["x"], False),
    (["x", "--helper=1"], False), (["x", "--", "--help"], False),
    (["x", "help"], False),
])
def test_help_flags_are_recognized(argv, asks):
    assert command_line.asks_for_help(argv) == asks


def test_an_imported_script_module_parses_no_flags():
    for argv in (["x", "--help"], ["x", "--num_tower=2"]):
        command_line.parse_flags_before_tensorflow("examples.cifar10.train", (), argv=argv)


def test_the_pack_bytes_default_is_towerlibs():
    import towerlib

    assert options.REPLICATED_PACK_BYTES == towerlib.Replicated().pack_bytes


# --- slow: fresh processes --------------------------------------------------------------------


@pytest.mark.slow  # a fresh Python (no TensorFlow)
def test_the_filter_passes_every_other_byte_in_order_even_if_the_process_dies():
    program = textwrap.dedent("""
        import os, sys
        from examples.cifar10 import quiet_tensorflow
        sys.stderr.write("before\\n")
        filtered = quiet_tensorflow._FilteredStderr()
        for line in %r:
            os.write(2, (line + "\\n").encode())
        os.write(2, b"a real error line\\n")
        sys.stderr.write("a Python warning\\n")
        if sys.argv[1] == "die":
            os._exit(3)  # as a crash in TensorFlow's import: no close()
        filtered.close()
        sys.stderr.write("after\\n")
    """) % (STARTUP_LINES,)
    for how, status, lines in (
            ("close", 0, ["before", "a real error line", "a Python warning", "after"]),
            ("die", 3, ["before", "a real error line", "a Python warning"])):
        # On "die" the filter process outlives its parent and writes out what is left.
        completed = _python(["-c", program, how], timeout=60)
        assert completed.returncode == status, completed.stderr
        assert completed.stderr.splitlines() == lines, completed.stderr


_PROBE = textwrap.dedent("""
    import runpy, sys
    sys.argv = %r
    try:
        runpy.run_module("examples.cifar10.%s", run_name="__main__", alter_sys=True)
    except SystemExit as exit:
        sys.stderr.write("exit %%s, tensorflow imported: %%s\\n"
                         %% (exit.code, "tensorflow" in sys.modules))
""")


@pytest.mark.slow  # fresh processes, two of them importing TensorFlow
def test_a_bad_flag_is_the_only_line_and_the_users_level_shows_tensorflows_lines(tmp_path):
    bad = ["-m", "examples.cifar10.train", "--num_tower=2"]
    completed = _python(bad)
    assert completed.returncode == 2
    assert completed.stderr.splitlines() == [
        "error: Unknown command line flag 'num_tower'. Did you mean: num_towers? See "
        "--helpshort for the flags."], completed.stderr
    # absl's parse fails before the script imports TensorFlow.
    probe = _python(["-c", _PROBE % (["train", "--num_tower=2"], "train")], timeout=120)
    assert probe.stderr.splitlines()[-1] == "exit 2, tensorflow imported: False", probe.stderr
    # A flag value refused after TensorFlow loaded: its start-up lines filtered out, the
    # error is the only line.
    wrong = ["-m", "examples.cifar10.train", "--train_dir=%s" % (tmp_path / "run"),
             "--model=vgg16"]
    completed = _python(wrong)
    assert completed.returncode == 2
    assert completed.stderr.splitlines() == [
        "error: --model=vgg16: Unknown model 'vgg16'. Choose one of convnet, resnet20, "
        "resnet32, resnet44, resnet56, resnet110, keras_resnet20 (any resnet depth 6n+2 works, e.g. "
        "resnet8 for quick tests)."], completed.stderr
    # A level the user set, any level, turns the filter off: everything shows again.
    completed = _python(wrong, _environ(TF_CPP_MIN_LOG_LEVEL="0"))
    assert completed.returncode == 2
    # (which start-up lines TensorFlow prints depends on the machine: the oneDNN line only
    # where oneDNN is on; absl's line before its log is initialized, always)
    assert "absl::InitializeLog() is called" in completed.stderr, completed.stderr
    assert completed.stderr.splitlines()[-1].startswith("error: --model=vgg16: Unknown model")


@pytest.mark.slow  # the scripts' help in fresh processes
@pytest.mark.parametrize("script, flag, listed", [
    ("train", "--help", "--num_towers"), ("eval", "--helpshort", "--eval_batch_size"),
    ("export", "--help", "--export_dir"), ("main", "--helpfull", "--train_epochs"),
])
def test_help_answers_before_tensorflow_loads(script, flag, listed):
    completed = _python(["-c", _PROBE % ([script, flag], script)], timeout=120)
    assert completed.stderr == "exit 1, tensorflow imported: False\n", completed.stderr
    assert listed in completed.stdout  # the script's own flags, not just its docstring
    module = importlib.import_module("examples.cifar10." + script)
    assert completed.stdout.startswith(module.__doc__.strip().splitlines()[0])


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("noise_data"))
    generate.generate(folder, train_per_file=40, test_examples=50)
    return folder


@pytest.mark.slow  # the main job (train, eval, export, load) in a fresh process, 4 steps
def test_the_main_job_prints_no_noise(tmp_path, tiny_data):
    completed = _python([
        "-m", "examples.cifar10.main", "--train_dir=%s" % (tmp_path / "run"),
        "--data_dir=%s" % tiny_data, "--model=resnet8", "--global_batch_size=16",
        "--train_epochs=0.32", "--lr_decay_epochs=", "--save_checkpoint_steps=4", "--seed=5"])
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert noise_lines(completed.stderr + completed.stdout) == [], completed.stderr[-3000:]
    # What it must still say: training, the evaluation, the export and the result.
    for expected in ("Trained from global step 0 to 4", "eval step 4: precision@1",
                     "Exported global step 4"):
        assert expected in completed.stderr, completed.stderr[-3000:]
    assert "when loaded back" in completed.stdout
    # Where the run's files are, what they weigh and how to look at them or remove them.
    run = str(tmp_path / "run")
    assert re.search(r"run folder %s: \d+ MB .*tensorboard --logdir %s.*rm -r %s" % (
        re.escape(run), re.escape(run), re.escape(run)), completed.stdout), completed.stdout
    assert all(line.startswith(("20", "  ", "CIFAR-10 example")) or not line
               for line in (completed.stderr + completed.stdout).splitlines()), (
        completed.stderr[-3000:])


@pytest.mark.slow  # the distributed example in a fresh process, on one machine
def test_the_distributed_example_prints_each_line_once(tmp_path):
    completed = _python([
        "examples/distributed/train.py", "--max_steps=2", "--num_towers=2",
        "--train_dir=%s" % (tmp_path / "run")])
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "finished: global_step=2" in completed.stdout
    text = completed.stderr
    assert "cuInit" not in text and "INFO:tensorflow:" not in text, text[-3000:]
    assert text.count("Graph was finalized.") == 1, text[-3000:]
    assert text.count("Saving checkpoint for step 2") == 1, text[-3000:]

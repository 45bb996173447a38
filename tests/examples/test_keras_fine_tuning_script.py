"""examples/keras_fine_tuning.py as a script: run by path, --help before TensorFlow, and a
result line that says chance when it is chance and whether the export matched."""

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "keras_fine_tuning.py"


def test_help_by_path_returns_without_importing_tensorflow():
    code = ("import runpy, sys\n"
            f"sys.argv = [{str(SCRIPT)!r}, '--help']\n"
            "try:\n"
            f"    runpy.run_path({str(SCRIPT)!r}, run_name='__main__')\n"
            "except SystemExit as done:\n"
            "    print('exit', done.code, 'tensorflow' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=str(ROOT / "examples"))
    assert done.stdout.strip().splitlines()[-1] == "exit 0 False", done.stderr[-2000:]
    assert "--phase_0_steps" in done.stdout


@pytest.mark.slow  # imports TensorFlow in a fresh Python
def test_the_path_form_finds_the_examples_package(tmp_path):
    """As a user runs it: from elsewhere, no PYTHONPATH naming the repository."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, str(SCRIPT), "--train_dir", str(tmp_path / "run"),
                           "--data_dir", "/dev/null/data"], capture_output=True, text=True,
                          timeout=300, cwd=str(tmp_path), env=env)
    assert "No module named 'examples'" not in done.stderr
    assert "/dev/null/data" in done.stderr  # it got as far as the data folder


def test_the_result_line_says_chance_and_whether_the_export_matched():
    from examples import keras_fine_tuning as lesson
    labels = np.arange(200) % 10
    logits = np.eye(10, dtype=np.float32)[(labels + (np.arange(200) % 9 != 0)) % 10]
    precision = float(np.mean(logits.argmax(1) == labels))  # 0.11: chance
    line = lesson.summary(precision, 200, 40, logits, logits.mean(0), logits, labels)
    assert "chance level (0.1): the base had only 40 steps" in line and "matches" in line
    other = lesson.summary(precision, 200, 40, logits * 2, logits.mean(0), logits, labels)
    assert "does NOT match" in other
    assert "above chance" in lesson.summary(1.0, 200, 40, np.eye(10)[labels],
                                            np.eye(10)[labels].mean(0), logits, labels)


@pytest.mark.slow   # TensorFlow and MobileNetV2 in a fresh process, trained until the signal
def test_ctrl_c_in_a_phase_exits_130_and_neither_trains_on_nor_exports(tmp_path):
    """Stopped in phase 0, the lesson ends with the train scripts' line and status 130:
    no later phase starts from the unfinished base, nothing is evaluated or exported."""
    import signal

    from examples.cifar10 import generate
    from tests.launch.tasks import wait_until

    data_dir = tmp_path / "data"
    generate.generate(str(data_dir), train_per_file=64, test_examples=50)
    train_dir, err = tmp_path / "run", tmp_path / "err.txt"
    with open(err, "w") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "examples.keras_fine_tuning", f"--train_dir={train_dir}",
             f"--data_dir={data_dir}", "--phase_0_steps=100000"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=stderr, text=True,
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES=""),
            start_new_session=True)
    try:
        wait_until(lambda: "step 10, loss = " in err.read_text() or process.poll() is not None,
                   400, "step 10 of phase 0")
        assert process.poll() is None, err.read_text()[-3000:]
        process.send_signal(signal.SIGINT)
        out, _ = process.communicate(timeout=180)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
    text = err.read_text()
    assert process.returncode == 130, text[-3000:]
    assert not (train_dir / "head").exists() and not (train_dir / "export").exists()
    assert "precision@1" not in out
    last = text.strip().splitlines()[-1]
    assert last.startswith("stopped by SIGINT at global step ") and \
        last.endswith("; rerun the same command to resume."), last

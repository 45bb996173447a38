"""examples.cifar10.main stopped by Ctrl-C mid-training: status 130 and the train script's
line ("rerun the same command to resume"), the unfinished run neither evaluated nor
exported."""

import os
import signal
import subprocess
import sys

import pytest

from examples.cifar10 import generate
from tests.launch.tasks import wait_until

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow   # TensorFlow in a fresh process, trained until the signal
def test_main_stopped_by_ctrl_c_exits_130_without_evaluating(tmp_path):
    data_dir = tmp_path / "data"
    generate.generate(str(data_dir), train_per_file=40, test_examples=50)
    train_dir, err = tmp_path / "run", tmp_path / "err.txt"
    command = [sys.executable, "-m", "examples.cifar10.main", f"--train_dir={train_dir}",
               f"--data_dir={data_dir}", "--model=resnet8", "--num_towers=2",
               "--device_type=cpu", "--global_batch_size=16", "--max_steps=100000",
               "--train_epochs=0", "--log_every_n_steps=1", "--save_checkpoint_steps=1000"]
    with open(err, "w") as stderr:
        process = subprocess.Popen(
            command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=stderr, text=True,
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES=""),
            start_new_session=True)
    try:
        wait_until(lambda: "step 2, loss = " in err.read_text() or process.poll() is not None,
                   240, "step 2 of the main job")
        assert process.poll() is None, err.read_text()[-3000:]
        process.send_signal(signal.SIGINT)
        out, _ = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
    text = err.read_text()
    assert process.returncode == 130, text[-3000:]
    assert "final test precision" not in out and not (train_dir / "export").exists()
    assert "neither evaluated nor exported" in text
    last = text.strip().splitlines()[-1]
    assert last.startswith("stopped by SIGINT at global step ") and \
        last.endswith("; rerun the same command to resume."), last

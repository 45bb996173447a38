"""Checkpoints interchange between one machine and an all-reduce job, both ways.

The chief's checkpoint holds its tower 0 copy under the plain names, as one
machine's does. With the distributed example (towerlib.global_batch_input,
sync batch norm, 4 towers in all):

- one machine trains to step 6, then two all-reducing workers resume its
  folder to step 12 (worker 1 has no checkpoint: it takes the chief's values);
- two workers train to step 6, then one machine resumes the chief's folder;

and both end within 1e-5 of one machine trained to step 12 without a stop.
"""

import re

import numpy as np
import pytest
import tensorflow as tf

from tests.distributed_processes import held_ports

PROCESS_BUDGET_SECS = 110
FINISHED = re.compile(r"finished: global_step=(\d+) loss=([0-9.]+)")

pytestmark = pytest.mark.slow

COMMON = ["--global_batch_size=14", "--batch_norm", "--bn_mode=sync",
          "--variable_update=replicated", "--save_checkpoint_steps=3",
          "--log_every_n_steps=1", "--startup_timeout_secs=40"]


def one_machine(processes, name, train_dir, max_steps):
    processes.start(name, COMMON + ["--num_towers=4", f"--train_dir={train_dir}",
                                    f"--max_steps={max_steps}"])


def two_workers(processes, name, train_dir, max_steps):
    ports = held_ports(2)
    hosts = f"--worker_hosts=127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}"
    for task in (0, 1):
        processes.start(f"{name}{task}", COMMON + [
            hosts, "--job_name=worker", f"--task_index={task}", "--num_towers=2",
            f"--train_dir={train_dir}", f"--max_steps={max_steps}"])


def values(train_dir):
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(train_dir)))
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
            if not name.startswith("_")}


def test_checkpoints_move_between_one_machine_and_workers(processes, tmp_path):
    one_machine(processes, "whole", tmp_path / "whole", 12)
    one_machine(processes, "first_half_one", tmp_path / "from_one", 6)
    two_workers(processes, "first_half_two", tmp_path / "from_two", 6)
    for name in ("whole", "first_half_one", "first_half_two0", "first_half_two1"):
        assert processes.wait(name, 90) == 0, processes.describe(name)
    two_workers(processes, "second_half_two", tmp_path / "from_one", 12)
    one_machine(processes, "second_half_one", tmp_path / "from_two", 12)
    for name in ("second_half_two0", "second_half_two1", "second_half_one"):
        assert processes.wait(name, 90) == 0, processes.describe(name)

    assert "model.ckpt-6" in processes.log_text("second_half_two0")  # resumed, not afresh
    assert "has no checkpoint of global step 6" in processes.log_text("second_half_two1")
    assert "model.ckpt-6" in processes.log_text("second_half_one")
    (whole_step, whole_loss), = FINISHED.findall(processes.log_text("whole"))
    for name in ("second_half_two0", "second_half_two1", "second_half_one"):
        (step, loss), = FINISHED.findall(processes.log_text(name))
        assert step == whole_step == "12"
        assert float(loss) == pytest.approx(float(whole_loss), abs=1e-5), name
    reference = values(tmp_path / "whole")
    for folder in ("from_one", "from_two"):
        resumed = values(tmp_path / folder)
        assert resumed.keys() == reference.keys()
        for name, value in reference.items():
            np.testing.assert_allclose(resumed[name], value, rtol=0, atol=1e-5,
                                       err_msg=f"{folder}: {name}")

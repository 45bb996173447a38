"""Weights the chief's tf_keras model holds reach every copy on every worker: the chief
initializes from them and broadcasts; a worker whose model loaded nothing gets them too."""

import os
import sys

import numpy as np
import pytest
import tf_keras

from tests.cluster import held_weights_job
from tests.distributed_processes import ProcessGroup, held_ports

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "held_weights_job.py")


@pytest.mark.slow  # two worker processes
def test_the_chiefs_held_weights_are_every_workers_step_0_values(tmp_path):
    tf_keras.utils.set_random_seed(5)
    saved = held_weights_job.small_model()
    saved.get_layer("bn").set_weights([np.full(3, v, np.float32) for v in (2., .5, .3, 4.)])
    saved.save_weights(str(tmp_path / "base.h5"))
    fresh = held_weights_job.small_model()
    fresh.load_weights(str(tmp_path / "base.h5"))
    want = {w.name.split(":")[0]: w.numpy() for w in fresh.weights}
    group = ProcessGroup(tmp_path, 240, command=(sys.executable, JOB))
    try:
        ports = ",".join(str(p) for p in held_ports(2))
        for task, weights in ((0, str(tmp_path / "base.h5")), (1, "")):
            group.start(f"worker{task}", [f"--task={task}", f"--ports={ports}",
                                          f"--weights={weights}",
                                          f"--out={tmp_path / f'w{task}.npz'}"])
        for task in (0, 1):
            assert group.wait(f"worker{task}", 240) == 0, group.describe(f"worker{task}")
    finally:
        group.close()
    for task in (0, 1):
        got = np.load(tmp_path / f"w{task}.npz")
        for name, value in want.items():
            copies = [n for n in got.files if n == name or n.endswith("/" + name)]
            assert len(copies) == 2, copies  # tower 0's and tower 1's
            for copy in copies:
                np.testing.assert_array_equal(got[copy], value,
                                              err_msg=f"worker {task}'s {copy}")

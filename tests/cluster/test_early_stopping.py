"""Early stopping across 2 all-reduce workers: decided once, applied at one step, resumable."""

import os
import re
import sys

import pytest

from tests.distributed_processes import ProcessGroup, free_ports
from towerlib.cluster.exits import RETRYABLE

pytestmark = pytest.mark.slow

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "early_stopping_job.py")
FINISHED = "finished: global_step=10 stopped_early_at=10"


@pytest.fixture
def processes(tmp_path):
    group = ProcessGroup(tmp_path, 240, command=(sys.executable, JOB))
    yield group
    group.close()


def start(processes, train_dir, suffix=""):
    ports = ",".join(map(str, free_ports(2)))
    for task in (0, 1):
        processes.start(f"worker{task}{suffix}", [f"--task={task}", f"--ports={ports}",
                                                  f"--train_dir={train_dir}"])


def test_both_workers_stop_at_the_defined_step_and_a_restart_keeps_the_patience(
        processes, tmp_path):
    start(processes, tmp_path / "whole")
    start(processes, tmp_path / "cut", "_cut")
    for name in ("worker0", "worker1"):
        assert processes.wait(name, 150) == 0, processes.describe(name)
        assert FINISHED in processes.log_text(name), processes.describe(name)
        assert "WorkerLostError" not in processes.log_text(name)
    # The cut job: worker 1 killed once both saved step 8 (one evaluation without an
    # improvement recorded), then both restarted. Had the count been lost, the first
    # evaluation after the restart would count as an improvement: no stop before 14.
    both_have_8 = lambda: all(os.path.exists(tmp_path / "cut" / d / "model.ckpt-8.index")
                              for d in ("", "worker_1"))
    processes.wait_for(both_have_8, "checkpoint 8 on both workers", 120,
                       watched="worker0_cut")
    processes.kill("worker1_cut")
    assert processes.wait("worker0_cut", 60) == RETRYABLE, processes.describe("worker0_cut")
    start(processes, tmp_path / "cut", "_again")
    for name in ("worker0_again", "worker1_again"):
        assert processes.wait(name, 150) == 0, processes.describe(name)
        assert FINISHED in processes.log_text(name), processes.describe(name)
    resumed = re.search(r"Restoring .*model\.ckpt-(\d+)", processes.log_text("worker0_again"))
    assert resumed and 8 <= int(resumed.group(1)) < 10, processes.describe("worker0_again")

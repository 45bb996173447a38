"""Early stopping across 2 all-reduce workers: decided once, applied at one step, resumable."""

import os
import re
import signal
import sys

import pytest

from tests.distributed_processes import ProcessGroup, held_ports
from towerlib.cluster.exits import RETRYABLE

pytestmark = pytest.mark.slow

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "early_stopping_job.py")
FINISHED = "finished: global_step=10 stopped_early_at=10"


@pytest.fixture
def processes(tmp_path):
    group = ProcessGroup(tmp_path, 240, command=(sys.executable, JOB))
    yield group
    group.close()


def start(processes, train_dir, suffix="", die_before_step=0):
    ports = ",".join(map(str, held_ports(2)))
    for task in (0, 1):
        dies = [f"--die_before_step={die_before_step}"] if task == 1 else []
        processes.start(f"worker{task}{suffix}", [f"--task={task}", f"--ports={ports}",
                                                  f"--train_dir={train_dir}", *dies])


def test_both_workers_stop_at_the_defined_step_and_a_restart_keeps_the_patience(
        processes, tmp_path):
    start(processes, tmp_path / "whole")
    # The cut job: worker 1 SIGKILLs itself before step 9, both having saved step 8
    # (one evaluation without an improvement recorded); then both are restarted. Had
    # the count been lost, the first evaluation after the restart would count as an
    # improvement: no stop before step 14.
    start(processes, tmp_path / "cut", "_cut", die_before_step=9)
    for name in ("worker0", "worker1"):
        assert processes.wait(name, 150) == 0, processes.describe(name)
        assert FINISHED in processes.log_text(name), processes.describe(name)
        assert "WorkerLostError" not in processes.log_text(name)
    assert processes.wait("worker1_cut", 60) == -signal.SIGKILL
    assert processes.wait("worker0_cut", 60) == RETRYABLE, processes.describe("worker0_cut")
    start(processes, tmp_path / "cut", "_again")
    for name in ("worker0_again", "worker1_again"):
        assert processes.wait(name, 150) == 0, processes.describe(name)
        assert FINISHED in processes.log_text(name), processes.describe(name)
    resumed = re.search(r"Restoring .*model\.ckpt-(\d+)", processes.log_text("worker0_again"))
    assert resumed and int(resumed.group(1)) == 8, processes.describe("worker0_again")

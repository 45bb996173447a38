"""The launching snippets of docs/distributed.md ("Launching") run, on loopback.

Each is read from the page and run as written, with what cannot exist here put in:
`train.py` (the reader's script) is examples/distributed/train.py, its folders are
under tmp_path, host names are 127.0.0.1 with ports free now, `srun` is a stand-in
that starts the step's tasks with the variables srun sets, and Kubernetes' TFJob
operator is its TF_CONFIG per replica. The Ray Train snippet is examples/ray_train.py
(tests/examples/test_ray_train_example.py).

Every process runs in a session of its own under a bound, and is gone afterwards.
"""

import json
import os
import pathlib
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import yaml

from tests import helpers
from tests.distributed_processes import free_ports, port_is_free
from tests.process_table import session_members
from towerlib.cluster import exits

pytestmark = pytest.mark.slow   # each starts a job of two or three TensorFlow processes

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = str(ROOT / "examples" / "distributed" / "train.py")
BUDGET_SECS = 300
STEPS = 20   # the example's default --max_steps


def _launching_section():
    text = (ROOT / "docs" / "distributed.md").read_text()
    start = text.index("## Launching")
    return text[start:text.index("**Ray Train**", start)]


def _blocks(language):
    return re.findall(rf"```{language}\n(.*?)```", _launching_section(), re.S)


def _commands(block):
    """The block's commands: continuation lines joined, comments dropped."""
    joined = block.replace("\\\n", " ")
    return [shlex.split(line, comments=True) for line in joined.splitlines()
            if shlex.split(line, comments=True)]


def _script(words, train_dir, example_flags):
    """`python train.py ...` as this interpreter running the example in `train_dir`."""
    out = []
    for word in words:
        if word == "python":
            out.append(sys.executable)
        elif word == "train.py":
            out += [EXAMPLE] + example_flags
        elif word == "...":
            out.append(f"--train_dir={train_dir}")
        elif word.startswith("--train_dir="):
            out.append(f"--train_dir={train_dir}")
        else:
            out.append(word)
    return out


def _launcher(words):
    assert words[0] == "towerlib-launch", words
    return [sys.executable, "-m", "towerlib.launch"] + words[1:]


def _environment(**changes):
    environ = {k: v for k, v in os.environ.items()
               if k not in ("TF_CONFIG", "TOWERLIB_SLURM_PORT_BASE")
               and not k.startswith("SLURM_")}
    environ.update(PYTHONPATH=helpers.python_path(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    environ.update(changes)
    return environ


class _Started:
    """Processes each in a session of their own; all stopped and checked at the end."""

    def __init__(self):
        self.processes = []

    def start(self, command, environ, log_path):
        log = open(log_path, "w")
        process = subprocess.Popen(command, cwd=ROOT, env=environ, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self.processes.append(process)
        return process

    def wait_all(self, budget=BUDGET_SECS):
        deadline = time.monotonic() + budget
        for process in self.processes:
            process.wait(timeout=max(1.0, deadline - time.monotonic()))
        return [process.returncode for process in self.processes]

    def stop_all(self):
        left = []
        for process in self.processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            deadline = time.monotonic() + 10
            while session_members(process.pid) and time.monotonic() < deadline:
                time.sleep(0.2)
            for pid in session_members(process.pid):
                left.append(pid)
                os.kill(pid, signal.SIGKILL)
        return left


@pytest.fixture
def started():
    processes = _Started()
    try:
        yield processes
    finally:
        left = processes.stop_all()
    assert not left, f"processes left: {left}"


def test_the_one_machine_commands_run(tmp_path, started):
    allreduce, with_ps = _commands(_blocks("bash")[0])
    runs = [(allreduce, tmp_path / "allreduce", ["--variable_update=replicated"]),
            (with_ps, tmp_path / "ps", [])]
    for index, (words, train_dir, flags) in enumerate(runs):
        started.start(_launcher(_script(words, train_dir, flags)), _environment(),
                      tmp_path / f"launch{index}.log")
    codes = started.wait_all()
    logs = [(tmp_path / f"launch{index}.log").read_text() for index in range(2)]
    assert codes == [0, 0], [log[-3000:] for log in logs]
    for log in logs:
        for worker in (0, 1):
            assert f"[worker {worker}] finished: global_step={STEPS}" in log, log[-3000:]
    assert "[ps 0] ps task 0: every worker is done" in logs[1], logs[1][-3000:]


def test_the_two_host_commands_run_as_two_hosts_on_loopback(tmp_path, started):
    """node1 and node2 are 127.0.0.1 with a port base each ('name:port', which the
    launcher takes as that host's own): TensorFlow's servers listen on every
    interface, so two hosts on one machine cannot share a port."""
    commands = _commands(_blocks("bash")[1])
    assert len(commands) == 2 and all("--host_index" in words for words in commands)
    first, second = free_ports(2)
    hosts = f"127.0.0.1:{first},127.0.0.1:{second}"
    for index, words in enumerate(commands):
        words = [hosts if word == "node1,node2" else word for word in words]
        assert hosts in words, words
        started.start(_launcher(_script(words, tmp_path / "run",
                                        ["--variable_update=replicated"])),
                      _environment(), tmp_path / f"host{index}.log")
    codes = started.wait_all()
    logs = [(tmp_path / f"host{index}.log").read_text() for index in range(2)]
    assert codes == [0, 0], [log[-3000:] for log in logs]
    assert f"[worker 0] finished: global_step={STEPS}" in logs[0], logs[0][-3000:]
    assert f"[worker 1] finished: global_step={STEPS}" in logs[1], logs[1][-3000:]


# A stand-in for srun: starts the step's tasks (2 on one node, 'localhost') with the
# variables srun sets, and returns the highest status, as srun does. On its first call
# it SIGKILLs task 1 once the chief's first checkpoint exists: a lost task.
FAKE_SRUN = textwrap.dedent('''\
    #!{python}
    import glob, os, subprocess, sys, time
    state = os.environ["FAKE_SRUN_STATE"]
    attempt = len(os.listdir(state)) + 1
    open(os.path.join(state, str(attempt)), "w").close()
    tasks = []
    for rank in range(2):
        env = dict(os.environ, SLURM_PROCID=str(rank), SLURM_STEP_NUM_TASKS="2",
                   SLURM_STEP_NODELIST="localhost", SLURM_STEP_TASKS_PER_NODE="2")
        tasks.append(subprocess.Popen(sys.argv[1:], env=env))
    if attempt == 1:
        deadline = time.monotonic() + 120
        while not glob.glob(os.environ["FAKE_SRUN_KILL_AFTER"]):
            if time.monotonic() > deadline or tasks[1].poll() is not None:
                break
            time.sleep(0.1)
        time.sleep(1.0)
        tasks[1].kill()
    codes = [task.wait(timeout=240) for task in tasks]
    print("fake srun: attempt %d, statuses %s" % (attempt, codes), flush=True)
    sys.exit(max(128 - code if code < 0 else code for code in codes))
''')


def test_the_sbatch_loop_restarts_on_a_lost_task_and_finishes(tmp_path, started):
    script = _blocks("bash")[2]
    assert "srun python train.py" in script and "exit 138" in script
    base = free_ports(1)[0]
    while not all(port_is_free(base + i) for i in range(2)):
        base = free_ports(1)[0]
    train_dir = tmp_path / "run"
    script = (script.replace("TOWERLIB_SLURM_PORT_BASE=23456",
                             f"TOWERLIB_SLURM_PORT_BASE={base}")
              .replace("python train.py", " ".join(_script(
                  ["python", "train.py"], train_dir,
                  ["--variable_update=replicated", "--sleep_secs_per_step=0.3"])))
              .replace("/shared/run", str(train_dir)))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(FAKE_SRUN.format(python=sys.executable))
    (bin_dir / "srun").chmod(0o755)
    (tmp_path / "srun_state").mkdir()
    (tmp_path / "job.sh").write_text(script)
    environ = _environment(
        PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        FAKE_SRUN_STATE=str(tmp_path / "srun_state"),
        FAKE_SRUN_KILL_AFTER=str(train_dir / "model.ckpt-0.index"))
    started.start(["bash", str(tmp_path / "job.sh")], environ, tmp_path / "job.log")
    codes = started.wait_all()
    log = (tmp_path / "job.log").read_text()
    assert codes == [0], log[-4000:]
    attempts = re.findall(r"fake srun: attempt (\d), statuses \[(-?\d+), (-?\d+)\]", log)
    assert [a[0] for a in attempts] == ["1", "2"], log[-4000:]
    assert attempts[0][1] == str(exits.RETRYABLE), log[-4000:]   # task 0: a lost peer
    assert attempts[1][1:] == ("0", "0"), log[-4000:]
    assert log.count(f"finished: global_step={STEPS}") == 2, log[-4000:]
    assert (train_dir / f"model.ckpt-{STEPS}.index").exists()


def test_the_tfjob_manifest_s_command_runs_with_the_operator_s_tf_config(tmp_path, started):
    manifest = yaml.safe_load(_blocks("yaml")[0])
    worker = manifest["spec"]["tfReplicaSpecs"]["Worker"]
    assert worker["restartPolicy"] == "ExitCode"
    # The statuses the page says the operator restarts on are towerlib's retryable ones.
    assert {130, 137, 138, 143} >= set(exits.RESTART_STATUSES) | {exits.RETRYABLE}
    command = worker["template"]["spec"]["containers"][0]["command"]
    replicas = worker["replicas"]
    ports = free_ports(replicas)
    for index in range(replicas):
        tf_config = {"cluster": {"worker": [f"localhost:{port}" for port in ports]},
                     "task": {"type": "worker", "index": index}, "environment": "cloud"}
        started.start(_script(command, tmp_path / "run", ["--variable_update=replicated"]),
                      _environment(TF_CONFIG=json.dumps(tf_config)),
                      tmp_path / f"worker{index}.log")
    codes = started.wait_all()
    logs = [(tmp_path / f"worker{index}.log").read_text() for index in range(replicas)]
    assert codes == [0] * replicas, [log[-3000:] for log in logs]
    for log in logs:
        assert f"finished: global_step={STEPS}" in log, log[-3000:]

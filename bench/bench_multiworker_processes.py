"""The processes of bench/bench_multiworker.py: starting, talking to and stopping them.

Each configuration's processes run bench/multiworker_proc.py with a JSON job; they
reply in JSON lines and obey {"command": "run", "steps": k}. Here: the free ports,
one process (Proc: its JSON in and out, a timeout on every reply, its CPU seconds from
/proc, its process group killed at the end), a configuration's processes together
(Running: a segment of steps on every worker, the step times and global losses) and
how each configuration's loss over the global batch is read from its workers.

Every process is in its own process group and dies with the benchmark
(PR_SET_PDEATHSIG); STARTED lists them all, for the benchmark's watchdog.
"""

import ctypes
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_PR_SET_PDEATHSIG = 1
try:
    _LIBC = ctypes.CDLL(None, use_errno=True)
except OSError:
    _LIBC = None


def _die_with_parent():
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))


def free_ports(count):
    """`count` distinct free TCP ports on 127.0.0.1 (bound to port 0, then released)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


# Every process started, for the watchdog.
STARTED = []


class ProcessError(RuntimeError):
    """A process replied with an error, exited, or did not reply in time."""


class Proc:
    """One bench.multiworker_proc process: JSON job in, JSON lines out."""

    def __init__(self, name, job, log_path):
        self.name, self.log_path = name, log_path
        env = dict(os.environ)
        env["PYTHONPATH"] = REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        env["CUDA_VISIBLE_DEVICES"] = ""
        env.pop("TF_CONFIG", None)
        self._log = open(log_path, "w", encoding="utf-8")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.multiworker_proc", json.dumps(job)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, env=env,
            cwd=REPO_ROOT, start_new_session=True, preexec_fn=_die_with_parent)
        self._buffer = b""
        STARTED.append(self)

    def send(self, message):
        try:
            self.process.stdin.write((json.dumps(message) + "\n").encode())
            self.process.stdin.flush()
        except BrokenPipeError:
            raise ProcessError(f"{self.name} exited ({self.process.poll()}); see "
                               f"{self.log_path}") from None

    def receive(self, timeout):
        """The next JSON reply; ProcessError on an error reply, an exit or a timeout."""
        deadline = time.monotonic() + timeout
        fd = self.process.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ProcessError(f"{self.name} did not reply within {timeout:.0f} s; "
                                   f"see {self.log_path}")
            ready, _, _ = select.select([fd], [], [], min(left, 1.0))
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise ProcessError(f"{self.name} exited ({self.process.wait()}) "
                                       f"without replying; see {self.log_path}")
                self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        message = json.loads(line)
        if "error" in message:
            raise ProcessError(f"{self.name}: {message['error']} (see {self.log_path})")
        return message

    def cpu_seconds(self):
        """User + system CPU seconds of the process so far (its threads included)."""
        try:
            with open(f"/proc/{self.process.pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            return 0.0

    def kill_group(self):
        """SIGKILLs the process's group (it and anything it started)."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def kill(self):
        self.kill_group()  # the group too when the process itself has already exited
        self.process.wait()
        self._log.close()


class Running:
    """The processes of one configuration."""

    def __init__(self, config, workers, ps):
        self.config, self.workers, self.ps = config, workers, ps

    @property
    def all(self):
        return self.workers + self.ps

    def cpu_seconds(self):
        return sum(p.cpu_seconds() for p in self.all)

    def run(self, steps, timeout):
        """Runs `steps` steps on every worker; (step seconds, global losses, CPU seconds)."""
        cpu_before = self.cpu_seconds()
        for proc in self.workers:
            proc.send({"command": "run", "steps": steps})
        replies = [proc.receive(timeout) for proc in self.workers]
        cpu = self.cpu_seconds() - cpu_before
        seconds = [max(step) for step in zip(*(r["seconds"] for r in replies))]
        run_seconds = [max(step) for step in zip(*(r["run_seconds"] for r in replies))]
        losses = global_losses(self.config, [r["losses"] for r in replies])
        return seconds, run_seconds, losses, cpu


def global_losses(config, per_worker):
    """Each step's loss over the global batch, from what each worker reported.

    towerlib's all-reduce and one process report the global mean (the
    workers' values must be identical); each parameter-server worker its own
    batch's mean (equal shares: their mean is the global one); each
    MultiWorkerMirroredStrategy worker the sum of its replicas' loss * n_i / B
    (their sum is the global mean).
    """
    steps = list(zip(*per_worker))
    if config.loss == "first":
        for values in steps:
            if len(set(values)) != 1:
                raise ProcessError(f"{config.key}: the workers' losses differ: {values}")
        return [values[0] for values in steps]
    if config.loss == "mean":
        return [sum(values) / len(values) for values in steps]
    return [sum(values) for values in steps]


def start_config(config, common, log_dir):
    """Starts a configuration's processes (they build, then wait before step 1)."""
    worker_ports = free_ports(config.workers)
    ps_ports = free_ports(1) if config.ps else []
    job = dict(common, worker_ports=worker_ports, ps_ports=ps_ports,
               workers=config.workers, towers=config.towers,
               train_dir=os.path.join(log_dir, f"train_{config.key}"))
    ps = [Proc(f"{config.key}/ps0", dict(job, role="ps", job_name="ps", task=0),
               os.path.join(log_dir, f"{config.key}_ps0.log"))] if config.ps else []
    workers = [Proc(f"{config.key}/worker{r}",
                    dict(job, role=config.role, job_name="worker", task=r),
                    os.path.join(log_dir, f"{config.key}_worker{r}.log"))
               for r in range(config.workers)]
    return Running(config, workers, ps)

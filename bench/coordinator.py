"""Running the worker processes: start, warm up, interleave, collect.

For each group (one model, one tower count) every configuration gets its own
worker process. The workers are started one after the other, each building
and warming up while the others wait, so that graph-construction times are
not inflated by a neighbour's build. Then, in each repetition, the workers
are asked in turn to run the same number of timed steps, in a new random
order each repetition (so that no configuration always follows the same
neighbour, whose leftover background work, a prefetch say, would land on
it). Only one worker computes at any moment
(the others block on their command pipe), and any change in machine load
during the group falls on every configuration alike; the ratios between
configurations are computed per repetition for that reason (`bench.measure`).
"""

import dataclasses
import json
import os
import random
import selectors
import subprocess
import sys
import time
from typing import Dict, List, Optional

from bench.configs import BenchConfig

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

STATUS_OK = "ok"
STATUS_UNAVAILABLE = "unavailable"
STATUS_FAILED = "failed"

# Reasons are kept to one line in reports; the full story is in the worker log.
MAX_REASON_CHARS = 300


class WorkerError(RuntimeError):
    """A worker replied with an error, died, or did not answer in time."""


@dataclasses.dataclass
class ConfigResult:
    """Everything measured for one configuration.

    Attributes:
      config: the BenchConfig.
      status: STATUS_OK, STATUS_UNAVAILABLE or STATUS_FAILED.
      reason: why it is unavailable or failed.
      step_seconds: per repetition, the mean wall-clock seconds per step of
        that repetition's timed steps (None where the worker had failed).
      step_cpu_seconds: the same for the process's CPU time (user + system,
        all threads): the work done per step, which load from other programs
        inflates much less than the wall-clock time.
      build_seconds: graph construction, one entry per build.
      first_step_seconds: the first session.run / function call (graph
        optimization, placement, tracing).
      initial_checksum / final_checksum: sum |w| of the weights before
        training / of the trainable weights after every step was run.
      peak_rss_mb, baseline_rss_mb: the process's peak resident memory at the
        end and before the model was built.
      gpu_peak_mb: per GPU, the allocator's peak (GPU machines only).
      trace_count: MirroredStrategy's tf.function traces (ready, finish).
    """

    config: BenchConfig
    status: str = STATUS_OK
    reason: str = ""
    step_seconds: List[Optional[float]] = dataclasses.field(default_factory=list)
    step_cpu_seconds: List[Optional[float]] = dataclasses.field(default_factory=list)
    build_seconds: List[float] = dataclasses.field(default_factory=list)
    first_step_seconds: Optional[float] = None
    initial_checksum: Optional[float] = None
    final_checksum: Optional[float] = None
    peak_rss_mb: Optional[float] = None
    baseline_rss_mb: Optional[float] = None
    gpu_peak_mb: Optional[List[float]] = None
    trace_count: Optional[List[int]] = None

    @property
    def ok(self):
        return self.status == STATUS_OK

    def fail(self, reason):
        self.status = STATUS_FAILED
        self.reason = reason

    def to_dict(self):
        values = dataclasses.asdict(self)
        values["config"] = self.config.to_dict()
        values["label"] = self.config.label
        return values

    @classmethod
    def from_dict(cls, values):
        """The inverse of to_dict (to re-render a report from a run's raw JSON)."""
        fields = {f.name for f in dataclasses.fields(cls)}
        kept = {k: v for k, v in values.items() if k in fields}
        kept["config"] = BenchConfig.from_dict(values["config"])
        return cls(**kept)


def worker_environment():
    """The workers' environment: this one, with the repository importable and TF quiet."""
    env = dict(os.environ)
    path = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = REPO_ROOT + (os.pathsep + path if path else "")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


class Worker:
    """One worker process and its JSON-lines pipe."""

    def __init__(self, job, log_path):
        self._log = open(log_path, "w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.worker", json.dumps(job)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
            cwd=REPO_ROOT, env=worker_environment())
        self.log_path = log_path

    def send(self, message):
        try:
            self.process.stdin.write((json.dumps(message) + "\n").encode())
            self.process.stdin.flush()
        except BrokenPipeError as error:
            raise WorkerError(f"the worker has exited; see {self.log_path}") from error

    def receive(self, timeout_seconds):
        """The worker's next reply; raises WorkerError on error, exit or timeout."""
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            if not selector.select(timeout_seconds):
                raise WorkerError(f"no reply within {timeout_seconds:.0f} s; see {self.log_path}")
        line = self.process.stdout.readline()
        if not line:
            self.process.wait()
            raise WorkerError(f"the worker exited with code {self.process.returncode}; "
                              f"see {self.log_path}")
        reply = json.loads(line)
        if "error" in reply:
            first_line = reply["error"].strip().splitlines()[0][:MAX_REASON_CHARS]
            raise WorkerError(f"{first_line} (log: {self.log_path})")
        return reply

    def stop(self):
        """Ends the process if it is still running (it is ours), and closes the log."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            stream.close()
        self._log.close()


def prepare_weights(model, weights_path, seed, log_path, timeout_seconds):
    """Runs a 'prepare' worker: draws `model`'s initial weights; returns its summary."""
    worker = Worker({"task": "prepare", "model": model, "weights_path": weights_path,
                     "seed": seed}, log_path)
    try:
        return worker.receive(timeout_seconds)
    finally:
        worker.stop()


def _launch(config, settings, log_dir):
    return Worker({"task": "train", "config": config.to_dict(),
                   "settings": settings.to_dict()},
                  os.path.join(log_dir, config.key + ".log"))


def _await_ready(worker, timeout_seconds, result):
    """Waits until a launched worker is built and warmed up; None if it cannot run."""
    try:
        ready = worker.receive(timeout_seconds)
    except WorkerError as error:
        worker.stop()
        result.fail(str(error))
        return None
    if "unavailable" in ready:
        worker.stop()
        result.status = STATUS_UNAVAILABLE
        result.reason = ready["unavailable"]
        return None
    result.build_seconds = ready["build_seconds"]
    result.first_step_seconds = ready["first_step_seconds"]
    result.initial_checksum = ready["initial_checksum"]
    result.baseline_rss_mb = ready["baseline_rss_mb"]
    if "trace_count" in ready:
        result.trace_count = [ready["trace_count"]]
    return worker


def _start_all(configs, settings, log_dir, timeout_seconds, results, start_parallelism,
               workers, progress):
    """Starts the group's workers, `start_parallelism` at a time, into `workers`.

    With 1 (the default of full runs) each worker builds its graph alone, so
    its construction time is not inflated by a neighbour's; more is faster
    (imports are single-threaded) and right for smoke runs.
    """
    step = max(1, start_parallelism)
    for first in range(0, len(configs), step):
        started = time.perf_counter()
        launched = []
        try:
            for config in configs[first:first + step]:
                launched.append((config, _launch(config, settings, log_dir)))
            while launched:
                config, worker = launched.pop(0)
                result = results[config.key]
                live = _await_ready(worker, timeout_seconds, result)
                progress(f"  {config.label:<34} {result.status:<11} "
                         f"{time.perf_counter() - started:6.1f} s to start"
                         + (f"  ({result.reason})" if result.reason else ""))
                if live is not None:
                    workers[config.key] = live
        finally:
            for _, worker in launched:  # only left over when interrupted
                worker.stop()


def run_group(configs: List[BenchConfig], settings, repeats, steps, log_dir,
              timeout_seconds, start_parallelism=1, order_seed=0,
              progress=print) -> Dict[str, ConfigResult]:
    """Times every configuration of one group, interleaved; returns results by key.

    `order_seed` seeds the per-repetition shuffles (the same seed, the same orders).
    """
    order_rng = random.Random(order_seed)
    results = {config.key: ConfigResult(config) for config in configs}
    workers = {}
    try:
        _start_all(configs, settings, log_dir, timeout_seconds, results,
                   start_parallelism, workers, progress)
        for key in workers:
            # One slot per repetition, aligned across configurations for the
            # paired ratios; a worker that fails leaves its later slots None.
            results[key].step_seconds = [None] * repeats
            results[key].step_cpu_seconds = [None] * repeats
        for repetition in range(repeats):
            keys = list(workers)
            order_rng.shuffle(keys)
            for key in keys:
                try:
                    workers[key].send({"command": "run", "steps": steps,
                                       "warmup": settings.segment_warmup_steps})
                    timing = workers[key].receive(timeout_seconds)
                    results[key].step_seconds[repetition] = timing["seconds"] / steps
                    results[key].step_cpu_seconds[repetition] = timing["cpu_seconds"] / steps
                except WorkerError as error:
                    results[key].fail(str(error))
                    workers.pop(key).stop()
            progress(f"  repetition {repetition + 1}/{repeats} done")

        for key, worker in list(workers.items()):
            try:
                worker.send({"command": "finish"})
                final = worker.receive(timeout_seconds)
            except WorkerError as error:
                results[key].fail(str(error))
                continue
            result = results[key]
            result.peak_rss_mb = final["peak_rss_mb"]
            result.gpu_peak_mb = final["gpu_peak_mb"]
            result.final_checksum = final["final_checksum"]
            if "trace_count" in final and result.trace_count is not None:
                result.trace_count.append(final["trace_count"])
    finally:
        for worker in workers.values():
            worker.stop()
    return results

"""One benchmark configuration in its own process, driven by the coordinator.

    python -m bench.worker '<json job>'

The job is either {"task": "prepare", ...} (draw the shared initial weights,
report the TensorFlow version and the GPUs, exit) or {"task": "train",
"config": ..., "settings": ...}. A training worker builds its graph, loads the
weights, warms up, says it is ready, then answers commands read as JSON lines
on stdin until told to finish:

    {"command": "run", "steps": k, "warmup": w}  ->  {"seconds": wall, "cpu_seconds": cpu}
    {"command": "finish"}  ->  {"peak_rss_mb": ..., "final_checksum": ...}

Replies are JSON lines on the process's original stdout; everything else
TensorFlow or Python prints is sent to stderr so it cannot corrupt them.
A configuration that cannot run here (bn_mode='sync' before it exists, more
GPU towers than GPUs) replies {"unavailable": reason} instead of ready.

Why a process per configuration: its peak memory (ru_maxrss) is its own,
MirroredStrategy must split the CPU into logical devices before TensorFlow
starts, and no configuration inherits another's caches or thread pools.
"""

import json
import os
import resource
import sys
import time
import traceback


def _protocol_stream():
    """A private copy of stdout for replies; fd 1 then points at stderr."""
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    return replies


def _reply(stream, message):
    stream.write(json.dumps(message) + "\n")
    stream.flush()


def _peak_rss_mb():
    """This process's peak resident set size (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _gpu_peak_mb(device_type, num_devices):
    """Peak allocator bytes per GPU in MB, where TensorFlow reports them; else None."""
    if device_type != "gpu":
        return None
    import tensorflow as tf
    peaks = []
    for index in range(num_devices):
        try:
            peaks.append(tf.config.experimental.get_memory_info(f"GPU:{index}")["peak"]
                         / 2.0 ** 20)
        except (ValueError, RuntimeError):
            return None
    return peaks


def prepare(job):
    """Draws the initial weights of job['model'] into job['weights_path']."""
    import tensorflow as tf

    from bench import models, weights
    model = models.load_model(job["model"])
    summary = weights.draw_initial_weights(model, job["weights_path"], job["seed"])
    summary.update(tf_version=tf.__version__,
                   num_gpus=len(tf.config.list_physical_devices("GPU")))
    return summary


def _trainable_checksum(values, trainable_names):
    from bench import weights
    return weights.checksum({name: values[name] for name in trainable_names})


class _Unavailable(Exception):
    """This configuration cannot run on this machine or with this towerlib."""


def _build_trainer(config, settings, initial_values, trainable_names):
    """The trainer for `config`, or raises _Unavailable."""
    import tensorflow as tf

    from bench import configs, graph_trainers, mirrored, models
    if settings.device_type == "gpu":
        # Listing physical devices does not initialize them: MirroredStrategy
        # can still configure its logical devices afterwards.
        gpus = len(tf.config.list_physical_devices("GPU"))
        if config.devices_used > gpus:
            raise _Unavailable(f"{config.devices_used} GPU towers, {gpus} GPU(s) here")
    model = models.load_model(config.model)
    if config.kind == configs.MIRRORED:
        devices = mirrored.configure_devices(config.devices_used, settings.device_type)
        return mirrored.MirroredTrainer(model, settings, devices, initial_values,
                                        trainable_names)
    try:
        return graph_trainers.build(config, model, settings, initial_values)
    except NotImplementedError as error:  # e.g. a bn_mode this towerlib lacks
        raise _Unavailable(str(error)) from error


def train(job, replies):
    """Builds one configuration and serves timing commands until 'finish'."""
    from bench import configs, weights
    config = configs.BenchConfig.from_dict(job["config"])
    settings = configs.RunSettings.from_dict(job["settings"])
    initial_values, trainable_names = weights.read_weights(settings.weights_path)
    baseline_rss_mb = _peak_rss_mb()
    try:
        trainer = _build_trainer(config, settings, initial_values, trainable_names)
    except _Unavailable as reason:
        _reply(replies, {"unavailable": str(reason)})
        return
    start = time.perf_counter()
    trainer.run_steps(1)
    first_step_seconds = time.perf_counter() - start
    trainer.run_steps(max(0, settings.warmup_steps - 1))
    ready = {"ready": True, "build_seconds": trainer.build_seconds,
             "first_step_seconds": first_step_seconds,
             "initial_checksum": trainer.initial_checksum,
             "baseline_rss_mb": baseline_rss_mb}
    if hasattr(trainer, "trace_count"):
        ready["trace_count"] = trainer.trace_count()
    _reply(replies, ready)

    for line in sys.stdin:
        command = json.loads(line)
        if command["command"] == "run":
            trainer.run_steps(command.get("warmup", 0))
            cpu_start = time.process_time()
            seconds = trainer.run_steps(command["steps"])
            _reply(replies, {"seconds": seconds,
                             "cpu_seconds": time.process_time() - cpu_start})
        elif command["command"] == "finish":
            final = trainer.weights()
            message = {"peak_rss_mb": _peak_rss_mb(),
                       "gpu_peak_mb": _gpu_peak_mb(settings.device_type,
                                                   config.devices_used),
                       "final_checksum": _trainable_checksum(final, trainable_names)}
            if hasattr(trainer, "trace_count"):
                message["trace_count"] = trainer.trace_count()
            trainer.close()
            _reply(replies, message)
            return
        else:
            raise ValueError(f"Unknown command {command!r}")


def main(argv):
    replies = _protocol_stream()
    job = json.loads(argv[1])
    try:
        if job["task"] == "prepare":
            _reply(replies, prepare(job))
        elif job["task"] == "train":
            train(job, replies)
        else:
            raise ValueError(f"Unknown task {job['task']!r}")
    except Exception as error:  # reported to the coordinator, which records it
        traceback.print_exc()
        _reply(replies, {"error": f"{type(error).__name__}: {error}"})
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""Benchmarks towerlib against hand-written towers, MirroredStrategy and one device.

    python -m bench.run --models=convnet,resnet20 --towers=1,2,4,8 \
        --global_batch=128 --steps=1 --repeats=30 --output=BENCHMARKS.md

For every model and tower count, starts one worker process per configuration
(towerlib in each batch-norm mode, the hand-written tower loop,
MirroredStrategy, one device on the whole batch, towerlib on the real CIFAR-10
input), times them in alternation, and writes a Markdown report with
images/sec, the ratios the issue sets targets for, graph-construction time,
peak memory and the machine it ran on. Without GPUs the towers are virtual
CPU devices; with GPUs the same command measures 1..N GPU scaling.

The report replaces --output, except for the sections an existing file has
after report.HAND_WRITTEN_MARKER (BENCHMARKS.md's standalone benchmarks),
which are kept.

--smoke runs a couple of tiny steps per configuration, to check that the
benchmark still works (tests/bench/test_bench_smoke.py); its numbers mean nothing.
"""

import json
import os
import shlex
import sys
import tempfile
import time

from absl import app, flags

from bench import cifar_files, coordinator, report, run_results
from bench import configs as configs_lib

FLAGS = flags.FLAGS

flags.DEFINE_list("models", ["convnet", "resnet20"], "Models to train (the CIFAR-10 example's).")
flags.DEFINE_list("towers", ["1", "2", "4", "8"], "Tower counts.")
flags.DEFINE_integer("global_batch", 128, "Examples per optimizer step, over all towers.")
flags.DEFINE_integer("steps", 1,
                     "Timed steps per configuration per repetition. Short segments keep "
                     "the configurations compared in one repetition close in time, so a "
                     "burst of load from another program hits them alike.")
flags.DEFINE_integer("repeats", 30, "Repetitions (each times every configuration once).")
flags.DEFINE_integer("warmup_steps", 3, "Untimed steps after a configuration is built.")
flags.DEFINE_integer("segment_warmup_steps", 0,
                     "Untimed steps before each timed segment (caches are cold after "
                     "the other configurations ran).")
flags.DEFINE_integer("build_repeats", 3,
                     "Graph builds of the configurations in the construction table "
                     "(towerlib first_tower, hand-written), for a median.")
flags.DEFINE_list("bn_modes", ["first_tower", "all_towers", "sync"], "towerlib bn_modes.")
flags.DEFINE_list("peers", list(configs_lib.PEERS),
                  "Configurations besides towerlib's: " + ", ".join(configs_lib.PEERS) + ".")
flags.DEFINE_enum("mirrored_input", "per_replica", ["per_replica", "distribute_dataset"],
                  "How MirroredStrategy receives the batch: each replica its own dataset "
                  "(distribute_datasets_from_function) or experimental_distribute_dataset.")
flags.DEFINE_float("learning_rate", 0.01, "Momentum optimizer's learning rate (every config).")
flags.DEFINE_string("data_dir", "",
                    "CIFAR-10 binary folder for the real-input configuration; empty: the "
                    "generated data set in the real format, in a cache folder.")
flags.DEFINE_enum("device_type", "auto", ["auto", "cpu", "gpu"],
                  "Tower devices; auto: GPUs when present.")
flags.DEFINE_integer("seed", 0, "Seeds the initial weights and the synthetic batch.")
flags.DEFINE_string("output", "BENCHMARKS.md", "Markdown report to write.")
flags.DEFINE_string("json_output", "", "If set, raw results as JSON here.")
flags.DEFINE_string("notes_file", "",
                    "Markdown appended to the report (an analysis of the run).")
flags.DEFINE_string("worker_log_dir", "", "Worker logs; default a new temporary folder.")
flags.DEFINE_integer("start_parallelism", 2,
                     "Workers of a group started (imported, built, warmed up) at once. "
                     "Building is single-threaded Python, so 2 on 2 cores roughly halves "
                     "the start-up; 1 times each construction alone. --smoke starts the "
                     "whole group at once.")
flags.DEFINE_integer("worker_timeout", 900, "Seconds to wait for any worker reply.")
flags.DEFINE_string("from_json", "",
                    "Re-render --output from this earlier run's --json_output (with "
                    "--notes_file) instead of running anything.")
flags.DEFINE_bool("smoke", False,
                  "A couple of steps per configuration, one warm-up step: checks the "
                  "benchmark runs; overrides --steps, --repeats and the warm-ups, and "
                  "--global_batch unless given.")

SMOKE_STEPS = 2
SMOKE_REPEATS = 2
SMOKE_GLOBAL_BATCH = 16


def _command_line(argv):
    return "python -m bench.run " + " ".join(shlex.quote(a) for a in argv[1:])


def _check_batch(global_batch, tower_counts):
    for towers in tower_counts:
        if global_batch % towers:
            raise app.UsageError(
                f"--global_batch={global_batch} does not split evenly over {towers} towers; "
                "the hand-written loop and MirroredStrategy need equal shards.")


def _prepare_models(models, weights_dir, log_dir, timeout):
    """Draws each model's initial weights; returns ({model: summary}, tf_version, gpus)."""
    info = {}
    for model in models:
        path = os.path.join(weights_dir, f"{model}-initial.npz")
        summary = coordinator.prepare_weights(model, path, FLAGS.seed,
                                              os.path.join(log_dir, f"{model}-prepare.log"),
                                              timeout)
        summary["weights_path"] = path
        info[model] = summary
        print(f"{model}: {summary['num_variables']} variables, "
              f"{summary['num_weights']} weights", flush=True)
    first = next(iter(info.values()))
    return info, first["tf_version"], first["num_gpus"]


def _notes():
    if not FLAGS.notes_file:
        return None
    with open(FLAGS.notes_file) as notes_file:
        return [notes_file.read().rstrip()]


def _render_from_json(path):
    """Writes the report of an earlier run from its raw JSON."""
    with open(path) as raw_file:
        raw = json.load(raw_file)
    results = [coordinator.ConfigResult.from_dict(r) for r in raw["results"]]
    raw["meta"]["rendered_from"] = os.path.basename(path)
    report.write_report(FLAGS.output, report.render(raw["meta"], results, _notes()))
    print(f"wrote {FLAGS.output} from {path}", flush=True)
    return 0


def main(argv):
    if FLAGS.from_json:
        return _render_from_json(FLAGS.from_json)
    started = time.perf_counter()
    load_before = run_results.load_average()
    tower_counts = [int(t) for t in FLAGS.towers]
    steps, repeats = FLAGS.steps, FLAGS.repeats
    warmup, segment_warmup = FLAGS.warmup_steps, FLAGS.segment_warmup_steps
    global_batch = FLAGS.global_batch
    start_parallelism = FLAGS.start_parallelism
    if FLAGS.smoke:
        steps, repeats, warmup, segment_warmup = SMOKE_STEPS, SMOKE_REPEATS, 1, 0
        if not FLAGS["global_batch"].present:
            global_batch = SMOKE_GLOBAL_BATCH
    _check_batch(global_batch, tower_counts)
    groups = configs_lib.plan(FLAGS.models, tower_counts, FLAGS.bn_modes, FLAGS.peers)
    if FLAGS.smoke and not FLAGS["start_parallelism"].present:
        start_parallelism = max(len(group) for _, group in groups)

    log_dir = FLAGS.worker_log_dir or tempfile.mkdtemp(prefix="towerlib-bench-")
    os.makedirs(log_dir, exist_ok=True)
    print(f"worker logs: {log_dir}", flush=True)
    model_info, tf_version, num_gpus = _prepare_models(
        FLAGS.models, log_dir, log_dir, FLAGS.worker_timeout)
    device_type = FLAGS.device_type
    if device_type == "auto":
        device_type = "gpu" if num_gpus else "cpu"
    data_dir = ""
    if configs_lib.PEER_CIFAR_INPUT in FLAGS.peers:
        data_dir = cifar_files.ensure_data_dir(FLAGS.data_dir)

    all_results = []
    for (model, towers), group in groups:
        print(f"{model}, {towers} tower(s):", flush=True)
        settings = configs_lib.RunSettings(
            global_batch=global_batch, warmup_steps=warmup,
            segment_warmup_steps=segment_warmup, learning_rate=FLAGS.learning_rate,
            momentum=0.9, weights_path=model_info[model]["weights_path"],
            data_dir=data_dir, device_type=device_type, seed=FLAGS.seed,
            build_repeats=FLAGS.build_repeats, mirrored_input=FLAGS.mirrored_input)
        results = coordinator.run_group(
            group, settings, repeats, steps, log_dir, FLAGS.worker_timeout,
            start_parallelism=start_parallelism, order_seed=f"{FLAGS.seed}-{model}-{towers}",
            progress=lambda line: print(line, flush=True))
        all_results.extend(results.values())

    meta = {
        "command": _command_line(sys.argv), "date": run_results.utc_now(),
        "machine": run_results.machine_description(), "tf_version": tf_version,
        "device_type": device_type, "num_gpus": num_gpus,
        "load_before": load_before, "load_after": run_results.load_average(),
        "wall_seconds": time.perf_counter() - started, "smoke": FLAGS.smoke,
        "global_batch": global_batch, "steps": steps, "repeats": repeats,
        "warmup_steps": warmup, "segment_warmup_steps": segment_warmup,
        "start_parallelism": start_parallelism, "order": "random",
        "tower_counts": tower_counts, "models": FLAGS.models, "model_info": model_info,
        "mirrored_input": FLAGS.mirrored_input, "data_dir": data_dir,
    }
    report.write_report(FLAGS.output, report.render(meta, all_results, _notes()))
    print(f"wrote {FLAGS.output}", flush=True)
    if FLAGS.json_output:
        with open(FLAGS.json_output, "w") as output:
            json.dump({"meta": meta, "results": [r.to_dict() for r in all_results]},
                      output, indent=1)
        print(f"wrote {FLAGS.json_output}", flush=True)
    failed = [r.config.key for r in all_results if r.status == coordinator.STATUS_FAILED]
    if failed:
        print(f"FAILED configurations: {failed} (see {log_dir})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    app.run(main)

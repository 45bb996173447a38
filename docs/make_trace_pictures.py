"""Traced steps of the CIFAR example's ResNet-20 for docs/traces.md.

    TF_CPP_MIN_LOG_LEVEL=2 python docs/make_trace_pictures.py            # every config
    TF_CPP_MIN_LOG_LEVEL=2 python docs/make_trace_pictures.py --towers=4 --bn_modes=sync

For each tower count, batch-norm mode and variable update it builds
examples/cifar10/models.py's resnet20 with towerlib.build_train_graph on
virtual CPU towers (global batch 64, Momentum, an in-memory batch fed by
tf.data), runs a few untimed warm-up steps, times some untraced steps, then
runs a few steps with FULL_TRACE and keeps the one whose span is the median.
It prints one markdown table row per config (towerlib.trace.analyze_step's
numbers), writes them all to docs/images/trace_numbers.json and draws the
pictures listed in PICTURES into docs/images/ (towerlib.trace.write_step_picture,
needs matplotlib).

Every config runs in this one process, one after the other; on a shared
machine other load lands on whichever config is running, so read single
numbers with care.
"""

import argparse
import json
import os
import pathlib
import statistics
import sys
import time

import numpy as np
import tensorflow as tf

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import towerlib  # noqa: E402
from examples.cifar10 import models  # noqa: E402
from towerlib import trace  # noqa: E402
from towerlib.trace import phases  # noqa: E402

IMAGES = ROOT / "docs" / "images"
GLOBAL_BATCH = 64
UPDATES = {"ps": lambda: towerlib.ParameterServer(), "replicated": lambda: towerlib.Replicated()}
# (towers, bn_mode, update) -> picture file name
PICTURES = {
    (1, "first_tower", "ps"): "trace_1_first_tower_ps.png",
    (4, "first_tower", "ps"): "trace_4_first_tower_ps.png",
    (8, "first_tower", "ps"): "trace_8_first_tower_ps.png",
    (8, "sync", "ps"): "trace_8_sync_ps.png",
    (8, "first_tower", "replicated"): "trace_8_first_tower_replicated.png",
}
FULL_TRACE = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)


def traced_config(towers, bn_mode, update, warmup, timed, traced):
    """(the median-span StepProfile, median untraced seconds per step, build seconds)."""
    rng = np.random.RandomState(0)
    images = rng.randn(256, 32, 32, 3).astype(np.float32)
    labels = rng.randint(0, 10, 256).astype(np.int32)
    with tf.Graph().as_default():
        tf.compat.v1.set_random_seed(0)
        batch = tf.compat.v1.data.make_one_shot_iterator(
            tf.data.Dataset.from_tensor_slices((images, labels)).repeat()
            .batch(GLOBAL_BATCH).prefetch(2)).get_next()
        started = time.time()
        train = towerlib.build_train_graph(
            models.make_model("resnet20"), batch,
            tf.compat.v1.train.MomentumOptimizer(0.05, 0.9),
            num_towers=towers, device_type="cpu", bn_mode=bn_mode,
            update=UPDATES[update](), summaries=False)
        build_seconds = time.time() - started
        with tf.compat.v1.Session(config=towerlib.session_config(towers)) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            # Replicated: the other towers' copies are local variables that read
            # tower 0's, so they are initialized after (not with) the global ones.
            session.run(tf.compat.v1.local_variables_initializer())
            for _ in range(warmup):
                session.run(train.train_op)
            seconds = []
            for _ in range(timed):
                started = time.perf_counter()
                session.run(train.train_op)
                seconds.append(time.perf_counter() - started)
            profiles = []
            for _ in range(traced):
                metadata = tf.compat.v1.RunMetadata()
                session.run(train.train_op, options=FULL_TRACE, run_metadata=metadata)
                step = int(session.run(train.global_step))
                profiles.append(trace.analyze_step(metadata, train.devices, step=step))
    profiles.sort(key=lambda p: p.span_micros)
    return profiles[len(profiles) // 2], statistics.median(seconds), build_seconds


def numbers(profile):
    span = profile.span_micros or 1
    share = {phase: profile.phase_micros[phase] / span
             for phase in (phases.EXCHANGE, phases.APPLY, phases.INPUT)}
    return {
        "step": profile.step,
        "span_ms": profile.span_micros / 1000,
        "overlap_fraction": profile.overlap_fraction,
        "mean_towers_computing": profile.mean_towers_computing,
        "exchange_share": share[phases.EXCHANGE],
        "apply_share": share[phases.APPLY],
        "input_share": share[phases.INPUT],
        "idle_share": profile.idle_micros / span,
        "unattributed_ms": profile.unattributed_micros / 1000,
        "summary": profile.summary_line(),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--towers", default="1,4,8")
    parser.add_argument("--bn_modes", default="first_tower,all_towers,sync")
    parser.add_argument("--updates", default="ps,replicated")
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--timed", type=int, default=5)
    parser.add_argument("--traced", type=int, default=3)
    parser.add_argument("--output", default=str(IMAGES / "trace_numbers.json"))
    args = parser.parse_args(argv)
    IMAGES.mkdir(parents=True, exist_ok=True)
    results = []
    print("| towers | bn_mode | update | untraced s/step | traced span ms | overlap "
          "| towers computing | exchange | apply | input | idle |")
    print("| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for towers in (int(t) for t in args.towers.split(",")):
        for bn_mode in args.bn_modes.split(","):
            for update in args.updates.split(","):
                profile, seconds, build = traced_config(
                    towers, bn_mode, update, args.warmup, args.timed, args.traced)
                row = dict(towers=towers, bn_mode=bn_mode, update=update,
                           untraced_seconds=seconds, build_seconds=build, **numbers(profile))
                results.append(row)
                print(f"| {towers} | {bn_mode} | {update} | {seconds:.3f} "
                      f"| {row['span_ms']:.0f} | {row['overlap_fraction']:.0%} "
                      f"| {row['mean_towers_computing']:.2f} "
                      f"| {row['exchange_share']:.0%} | {row['apply_share']:.0%} "
                      f"| {row['input_share']:.0%} | {row['idle_share']:.0%} |", flush=True)
                name = PICTURES.get((towers, bn_mode, update))
                if name:
                    trace.write_step_picture(profile, IMAGES / name)
    with open(args.output, "w") as out:
        json.dump({"global_batch": GLOBAL_BATCH, "model": "resnet20",
                   "load_average_at_end": os.getloadavg(), "configs": results}, out, indent=1)


if __name__ == "__main__":
    main()

"""The sharded update against Replicated(): step time and peak memory, 4 towers, Adam.

    python bench/bench_sharded_update.py --repetitions=3

A model of --million_parameters (default 50.3 M: four dense layers of 3,584 x 3,584
and a small head) trains with AdamOptimizer on --towers virtual CPU towers at a small
global batch (--global_batch), where the update's share of the step is largest.
Each measurement runs in a fresh process (a process's peak resident set only grows),
unsharded and sharded alternating over the repetitions; each process builds the
step, initializes it, runs --warmup steps, times --steps steps (the median), and
reports its peak resident set size (ru_maxrss) after the start (initializing, and
across workers the chief's broadcast) and at the end, and what towerlib.replica_bytes
reads from the graph. Reported: each configuration's medians, and sharded / unsharded.

    python bench/bench_sharded_update.py --workers=2 --towers=2 --repetitions=3

runs each measurement as --workers worker processes on 127.0.0.1 (free ports, no ps
task, towerlib.cluster), each with --towers towers and its share of the batch: the
sharded update across workers, whose slots are sharded over every tower of every
worker. Reported: the chief's median step, and the largest peak resident set of the
workers (nothing is saved: a save would gather the slots, towerlib.update.slot_shards).

    python bench/bench_sharded_update.py --traffic

counts instead, from built graphs (nothing runs), what crosses between devices in one
step of ResNet-50's weights (bench/traffic_model.py, 161 variables, Adam) at 2, 4 and 8
towers, through the graph transport and through collectives: the busiest device's
bytes (gradients, weights and collectives; not the input batch), sharded against
unsharded, beside the ring all-reduce of the weights' bytes, 2 (N - 1) / N x S.
With --workers=W (and --towers), the same for the chief of 2, 4 and 8 workers of
--towers towers each (graphs only), through the build's default exchange.

Not a test: numbers depend on the machine and on whatever else it runs.
"""

import json
import os
import resource
import statistics
import subprocess
import sys
import time

from absl import app, flags

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

FLAGS = flags.FLAGS
flags.DEFINE_integer("repetitions", 3, "Fresh-process measurements per configuration.")
flags.DEFINE_integer("towers", 4, "Virtual CPU towers (per worker).")
flags.DEFINE_integer("workers", 1, "Worker processes (1: one process, no cluster).")
flags.DEFINE_integer("task", 0, "Internal: this worker's index.")
flags.DEFINE_string("ports", "", "Internal: the workers' ports, comma-separated.")
flags.DEFINE_integer("global_batch", 16, "Examples per step, all towers together.")
flags.DEFINE_integer("width", 3584, "Width of the dense layers.")
flags.DEFINE_integer("depth", 4, "Dense layers of width x width.")
flags.DEFINE_integer("warmup", 2, "Steps before timing.")
flags.DEFINE_integer("steps", 5, "Timed steps per process.")
flags.DEFINE_bool("traffic", False, "Count each step's bytes between devices instead.")
flags.DEFINE_string("measure", "", "Internal: 'sharded' or 'unsharded': one measurement, "
                    "printed as JSON.")

CONFIGURATIONS = ("unsharded", "sharded")
MEASUREMENT_DEADLINE_SECS = 1800


def _dense_model(width, depth):
    import tensorflow as tf

    from towerlib import layers

    def model(inputs, ctx):
        del ctx
        features, labels = inputs
        hidden = features
        for index in range(depth):
            hidden = tf.nn.relu(layers.dense(hidden, width, name=f"dense{index}"))
        logits = layers.dense(hidden, 10, name="logits")
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=labels, logits=logits))
    return model


def measure(configuration):
    """{'step_seconds', 'peak_rss_bytes', 'parameters', 'held'} of one fresh process."""
    import numpy as np
    import tensorflow as tf

    import towerlib

    update = towerlib.Replicated(shard_update=configuration == "sharded")
    with tf.Graph().as_default():
        rng = np.random.RandomState(FLAGS.task)   # each worker its own share of the batch
        rows = FLAGS.global_batch // FLAGS.workers
        features = tf.constant(rng.randn(rows, FLAGS.width).astype(np.float32))
        labels = tf.constant(rng.randint(0, 10, rows).astype(np.int32))
        train, target, config = _build(_dense_model(FLAGS.width, FLAGS.depth),
                                       (features, labels), update)
        parameters = sum(v.shape.num_elements() for v in tf.compat.v1.trainable_variables())
        held = towerlib.replica_bytes(train)
        with tf.compat.v1.Session(target, config=config) as session:
            train.initialize(session)
            start_peak = _peak_resident_bytes()
            for _ in range(FLAGS.warmup):
                session.run(train.train_op)
            times = []
            for _ in range(FLAGS.steps):
                start = time.perf_counter()
                session.run(train.train_op)
                times.append(time.perf_counter() - start)
    return {"step_seconds": statistics.median(times),
            "peak_rss_bytes": _peak_resident_bytes(),
            "start_peak_rss_bytes": start_peak,
            "parameters": parameters,
            "slot_bytes_per_tower": max(h["slots"] for h in held.values())}


def _peak_resident_bytes():
    """This process's peak resident set so far (ru_maxrss, in KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _build(model, batch, update):
    """(train graph, session target, session config): one process, or this worker's part."""
    import tensorflow as tf

    import towerlib
    from towerlib import cluster as cluster_lib

    optimizer = tf.compat.v1.train.AdamOptimizer(1e-4)
    if FLAGS.workers == 1:
        train = towerlib.build_train_graph(model, batch, optimizer, num_towers=FLAGS.towers,
                                           device_type="cpu", update=update, summaries=False)
        return train, "", towerlib.session_config(FLAGS.towers)
    cluster = cluster_lib.cluster_from_flags(
        worker_hosts=",".join(f"127.0.0.1:{port}" for port in FLAGS.ports.split(",")),
        job_name="worker", task_index=FLAGS.task)
    server = cluster_lib.start_server(cluster, FLAGS.towers)
    graph = cluster_lib.build_sync_train_graph(
        model, batch, optimizer, cluster, num_towers=FLAGS.towers, device_type="cpu",
        update=update, summaries=False)
    config = cluster_lib.session_config(cluster, FLAGS.towers)
    config.operation_timeout_in_ms = 600_000   # a lost worker ends the run, not a wait
    return graph.train_graph, server.target, config


def _run_fresh(configuration):
    """One measurement in fresh processes: the chief's step, each peak RSS the largest
    of the workers'. A worker that fails ends the others at once; every worker dies
    with this process, and the whole measurement has one deadline."""
    import tempfile

    from bench.bench_multiworker_processes import _die_with_parent, free_ports

    argv = [sys.executable, os.path.abspath(__file__), f"--measure={configuration}"] + [
        f"--{name}={getattr(FLAGS, name)}" for name in
        ("towers", "workers", "global_batch", "width", "depth", "warmup", "steps")]
    ports = ",".join(map(str, free_ports(FLAGS.workers)))
    with tempfile.TemporaryDirectory() as folder:
        outs = [os.path.join(folder, f"worker{task}.json") for task in range(FLAGS.workers)]
        workers = []
        try:
            for task, out in enumerate(outs):
                with open(out, "w") as stdout:
                    workers.append(subprocess.Popen(
                        argv + [f"--task={task}", f"--ports={ports}"], stdout=stdout,
                        start_new_session=True, preexec_fn=_die_with_parent))
            _wait_for_all(workers, deadline=time.monotonic() + MEASUREMENT_DEADLINE_SECS)
            results = []
            for out in outs:
                with open(out) as lines:
                    results.append(json.loads(lines.read().strip().splitlines()[-1]))
        finally:
            for worker in workers:
                if worker.poll() is None:
                    worker.kill()
                    worker.wait()
    peaks = {key: max(r[key] for r in results)
             for key in ("peak_rss_bytes", "start_peak_rss_bytes")}
    return dict(results[0], **peaks)


def _wait_for_all(workers, deadline):
    """Returns once every worker exited 0; raises at the first failure or the deadline."""
    while True:
        codes = [worker.poll() for worker in workers]
        failed = [task for task, code in enumerate(codes) if code not in (None, 0)]
        if failed:
            raise RuntimeError(f"worker {failed[0]}'s measurement exited with "
                               f"{codes[failed[0]]}")
        if all(code == 0 for code in codes):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"a measurement ran past {MEASUREMENT_DEADLINE_SECS} s")
        time.sleep(0.5)


def busiest_device_bytes(num_towers, update, exchange, workers=1):
    """max over devices of max(sent, received) in one step, and the weights' bytes.

    With `workers` > 1, the step of worker 0 of that many (its graph only: nothing
    runs, so no cluster is needed), each with `num_towers` towers.
    """
    import numpy as np
    import tensorflow as tf

    import towerlib
    from bench import traffic_count, traffic_model

    with tf.Graph().as_default():
        images = tf.constant(np.zeros([8 * num_towers, 32, 32, 3], np.float32))
        labels = tf.constant(np.zeros([8 * num_towers], np.int32))
        placement = (dict(num_towers=num_towers, device_type="cpu") if workers == 1 else
                     dict(devices=[f"/job:worker/task:0/device:CPU:{i}"
                                   for i in range(num_towers)],
                          workers=towerlib.WorkerGroup(workers, 0)))
        train = towerlib.build_train_graph(
            traffic_model.make_traffic_model("resnet50_sized"), (images, labels),
            tf.compat.v1.train.AdamOptimizer(1e-4), update=update, exchange=exchange,
            summaries=False, **placement)
        weights = sum(v.shape.num_elements() * 4 for v in tf.compat.v1.trainable_variables())
        per_device = traffic_count.count_traffic(train.train_op).per_device(
            kinds=["variable", "computed", "collective"])
        return max(max(pair) for pair in per_device.values()), weights


def traffic():
    import towerlib

    if FLAGS.workers > 1:
        return traffic_across_workers()
    for exchange in ("graph", "collective"):
        for towers in (2, 4, 8):
            unsharded, weights = busiest_device_bytes(towers, towerlib.Replicated(), exchange)
            sharded, _ = busiest_device_bytes(
                towers, towerlib.Replicated(shard_update=True), exchange)
            ring = 2 * (towers - 1) / towers * weights
            print(f"{exchange:10s} {towers} towers: busiest device, in S = {weights / 1e6:.1f}"
                  f" MB: unsharded {unsharded / weights:.3f}, sharded {sharded / weights:.3f},"
                  f" ring all-reduce {ring / weights:.3f}; sharded / unsharded "
                  f"{sharded / unsharded:.3f}", flush=True)


def traffic_across_workers():
    """The chief's busiest device across 2, 4 and 8 workers of --towers towers each."""
    import towerlib

    for workers in (2, 4, 8):
        unsharded, weights = busiest_device_bytes(FLAGS.towers, towerlib.Replicated(),
                                                  None, workers)
        sharded, _ = busiest_device_bytes(
            FLAGS.towers, towerlib.Replicated(shard_update=True), None, workers)
        members = workers * FLAGS.towers
        ring = 2 * (members - 1) / members * weights
        print(f"{workers} workers x {FLAGS.towers} towers: the chief's busiest device, in "
              f"S = {weights / 1e6:.1f} MB: unsharded {unsharded / weights:.3f}, sharded "
              f"{sharded / weights:.3f}, ring all-reduce {ring / weights:.3f}; "
              f"sharded / unsharded {sharded / unsharded:.3f}", flush=True)


def main(argv):
    del argv
    if FLAGS.traffic:
        traffic()
        return
    if FLAGS.global_batch % FLAGS.workers:
        raise app.UsageError(f"--global_batch={FLAGS.global_batch} does not divide over "
                             f"--workers={FLAGS.workers}. Fix: a multiple of --workers.")
    if FLAGS.measure:
        print(json.dumps(measure(FLAGS.measure)))
        return
    results = {name: [] for name in CONFIGURATIONS}
    for repetition in range(FLAGS.repetitions):
        order = CONFIGURATIONS if repetition % 2 == 0 else CONFIGURATIONS[::-1]
        for name in order:
            results[name].append(_run_fresh(name))
            print(name, results[name][-1], flush=True)
    medians = {name: {key: statistics.median(r[key] for r in runs) for key in runs[0]}
               for name, runs in results.items()}
    for name, values in medians.items():
        print(f"{name}: {values['parameters'] / 1e6:.1f} M parameters, step "
              f"{values['step_seconds']:.3f} s, peak RSS {values['peak_rss_bytes'] / 2**30:.2f}"
              f" GiB (after the start {values['start_peak_rss_bytes'] / 2**30:.2f} GiB), "
              f"slots per tower {values['slot_bytes_per_tower'] / 2**20:.0f} MiB")
    sharded, unsharded = medians["sharded"], medians["unsharded"]
    print(f"sharded / unsharded: step time "
          f"{sharded['step_seconds'] / unsharded['step_seconds']:.3f}, peak RSS "
          f"{sharded['peak_rss_bytes'] / unsharded['peak_rss_bytes']:.3f} (after the start "
          f"{sharded['start_peak_rss_bytes'] / unsharded['start_peak_rss_bytes']:.3f}), "
          f"slots per tower "
          f"{sharded['slot_bytes_per_tower'] / unsharded['slot_bytes_per_tower']:.3f} "
          f"({FLAGS.workers} x {FLAGS.towers} towers, global batch {FLAGS.global_batch}, load "
          f"{os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    app.run(main)

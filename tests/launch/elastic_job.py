"""A user's script for elastic launches: its global batch depends on the step alone.

    towerlib-launch --workers 1:2 --max_restarts 3 -- \
        python elastic_job.py TRAIN_DIR MAX_STEPS --exit 1:3:69 --exit 0:14:138

The cluster comes from TF_CONFIG (the launcher's, for however many workers this
attempt has); every worker trains TOWERS towers, all-reducing (Replicated, sync
batch norm, Momentum), and checkpoints every SAVE_STEPS steps.

The input: --input step_rows (the default) reads the global batch of step s as
rows s*B .. s*B+B-1 (modulo the table) of one fixed table, worker r of W taking
its contiguous slice, so the examples of a step are the same on any number of
workers. --input global_batch reads the same table through
towerlib.global_batch_input (the library's topology-independent input).

--exit RANK:STEP:STATUS: worker RANK (of this attempt's cluster) ends the process
with STATUS right after global step STEP, without saving, once per run (a marker
file in TRAIN_DIR says it happened): 69 says its host is lost (towerlib-launch's
HOST_LOST), 138 a retryable fault. Each step prints
'step S restart R workers W at T', and an exit 'exit STATUS at step S at T'.
"""

import argparse
import json
import os
import sys
import time

import numpy as np
import tensorflow as tf

import towerlib
from towerlib import cluster as cluster_lib

TOWERS = 2
GLOBAL_BATCH = 12       # 6 rows a worker of 2, 3 a tower
SAVE_STEPS = 4
ROWS, FEATURES = 96, 5
SEED = 7


def table():
    """The fixed examples: features [ROWS, FEATURES] and regression targets [ROWS, 1]."""
    rng = np.random.RandomState(11)
    features = rng.normal(size=(ROWS, FEATURES)).astype(np.float32)
    targets = (np.tanh(features @ rng.normal(size=(FEATURES, 1)))).astype(np.float32)
    return features, targets


def step_rows(cluster, global_step):
    """This worker's slice of the global batch of the step being taken."""
    features, targets = (tf.constant(a) for a in table())
    workers, rank = cluster.num_replicas, cluster.replica_index
    first, end = rank * GLOBAL_BATCH // workers, (rank + 1) * GLOBAL_BATCH // workers
    rows = (tf.cast(global_step, tf.int32) * GLOBAL_BATCH + tf.range(first, end)) % ROWS
    return tf.gather(features, rows), tf.gather(targets, rows)


def library_rows(cluster):
    """The same table through towerlib.global_batch_input."""
    return towerlib.global_batch_input(table(), GLOBAL_BATCH, seed=SEED,
                                       workers=cluster.worker_group)


def tower(inputs, ctx):
    features, targets = inputs
    w1 = tf.compat.v1.get_variable("w1", [FEATURES, 8])
    hidden = towerlib.batch_norm(tf.matmul(features, w1), ctx, name="bn", momentum=0.8)
    w2 = tf.compat.v1.get_variable("w2", [8, 1])
    return tf.reduce_mean(tf.square(tf.matmul(tf.nn.tanh(hidden), w2) - targets))


class StepsAndExits(tf.compat.v1.train.SessionRunHook):
    """Prints each step; ends the process once where an --exit rule says."""

    def __init__(self, cluster, rules, marker_dir):
        self._cluster, self._rules, self._marker_dir = cluster, rules, marker_dir

    def begin(self):
        self._global_step = tf.compat.v1.train.get_global_step()

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs(self._global_step)

    def after_run(self, run_context, run_values):
        step = run_values.results + 1
        restart = os.environ.get("TOWERLIB_LAUNCH_RESTART", "-")
        print(f"step {step} restart {restart} workers {self._cluster.num_replicas} "
              f"at {time.time():.3f}", flush=True)
        for index, (rank, at_step, status) in enumerate(self._rules):
            if rank == self._cluster.replica_index and step >= at_step and \
                    self._first_time(f"exit-{index}"):
                print(f"exit {status} at step {step} at {time.time():.3f}", flush=True)
                sys.stderr.flush()
                os._exit(status)   # as a lost host: nothing saved, nothing said
        time.sleep(0.1)   # room between steps, as a real step's time

    def _first_time(self, name):
        try:
            os.close(os.open(os.path.join(self._marker_dir, name),
                             os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        return True


def parse_rule(text):
    rank, step, status = (int(part) for part in text.split(":"))
    return rank, step, status


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("train_dir")
    parser.add_argument("max_steps", type=int)
    parser.add_argument("--exit", type=parse_rule, action="append", default=[])
    parser.add_argument("--input", choices=("step_rows", "global_batch"),
                        default="step_rows")
    args = parser.parse_args()
    cluster = cluster_lib.resolve_cluster()
    server = cluster_lib.start_server(cluster, TOWERS)
    os.makedirs(args.train_dir, exist_ok=True)
    with tf.Graph().as_default():
        with tf.compat.v1.device(f"{cluster.task_device}/device:CPU:0"):
            tf.compat.v1.set_random_seed(5)
            global_step = tf.compat.v1.train.get_or_create_global_step()
            inputs = (step_rows(cluster, global_step) if args.input == "step_rows"
                      else library_rows(cluster))
        graph = cluster_lib.build_sync_train_graph(
            tower, inputs, tf.compat.v1.train.MomentumOptimizer(0.05, 0.9), cluster,
            num_towers=TOWERS, device_type="cpu", global_step=global_step,
            bn_mode="sync", update=towerlib.Replicated(), summaries=False)
        step, loss = cluster_lib.run_distributed_training(
            graph, server, train_dir=args.train_dir, max_steps=args.max_steps,
            hooks=[StepsAndExits(cluster, args.exit, args.train_dir)],
            startup_timeout_secs=120, step_deadline_secs=60,
            save_checkpoint_steps=SAVE_STEPS, log_every_n_steps=1000)
    print(f"finished: global_step={step} loss={loss:.6f}", flush=True)


def task_name():
    task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {})
    return f"{task.get('type', 'worker')} {task.get('index', '?')}"


if __name__ == "__main__":
    cluster_lib.exit_by_meaning(main, task=task_name)

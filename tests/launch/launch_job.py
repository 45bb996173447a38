"""A user's own training script, as towerlib.launch runs it.

    towerlib-launch --workers 2 --max_restarts 2 -- python launch_job.py TRAIN_DIR MAX_STEPS

Written as a user writes one: the cluster from TF_CONFIG (the launcher's), two
towers per worker all-reducing (update=towerlib.Replicated()), a shuffled
tf.data pipeline read through towerlib.saved_position_iterator so that a
restart from a checkpoint reads the batch it would have read, sync batch
norm, Momentum (slots to restore), a checkpoint every SAVE_STEPS steps, and
main wrapped in exit_by_meaning (a lost peer exits 138, which the launcher
restarts). Each step prints its global step, the launcher's restart count and
the time it ended, for the test's restart-time measurement.

With ps tasks in the cluster (towerlib-launch --ps 1) the same script trains
through them instead (update=towerlib.ParameterServer(), per-worker batch
norm), and a ps task serves until every worker is done.
"""

import json
import os
import sys
import time

import numpy as np
import tensorflow as tf

import towerlib
from towerlib import cluster as cluster_lib

TOWERS = 2
BATCH_PER_WORKER = 10    # split 5 + 5 over the towers
SAVE_STEPS = 4
STEP_SLEEP_SECS = 0.2    # room for the test to kill a worker mid-run


def dataset(replica_index, num_replicas):
    """This worker's shard of 400 fixed examples, shuffled (a state the checkpoint holds)."""
    rng = np.random.RandomState(3)
    features = rng.normal(size=(400, 6)).astype(np.float32)
    labels = rng.randint(0, 3, size=400).astype(np.int32)
    return (tf.data.Dataset.from_tensor_slices((features, labels))
            .shard(num_replicas, replica_index)
            .shuffle(64, seed=11, reshuffle_each_iteration=True)
            .repeat()
            .batch(BATCH_PER_WORKER, drop_remainder=True))


def tower(inputs, ctx):
    features, labels = inputs
    w1 = tf.compat.v1.get_variable("w1", [6, 8])
    hidden = towerlib.batch_norm(tf.matmul(features, w1), ctx, name="bn", momentum=0.9)
    w2 = tf.compat.v1.get_variable("w2", [8, 3])
    logits = tf.matmul(tf.nn.tanh(hidden), w2)
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=labels, logits=logits))


class PrintSteps(tf.compat.v1.train.SessionRunHook):
    """'step 9 restart 1 at 1795835839.642': each step's end, for the test."""

    def begin(self):
        self._global_step = tf.compat.v1.train.get_global_step()

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs(self._global_step)

    def after_run(self, run_context, run_values):
        restart = os.environ.get("TOWERLIB_LAUNCH_RESTART", "-")
        print(f"step {run_values.results + 1} restart {restart} at {time.time():.3f}",
              flush=True)
        time.sleep(STEP_SLEEP_SECS)


def main():
    train_dir, max_steps = sys.argv[1], int(sys.argv[2])
    cluster = cluster_lib.resolve_cluster()
    if cluster.is_ps:
        cluster_lib.run_parameter_server(cluster, timeout_secs=600)
        print("ps done: every worker finished", flush=True)
        return
    server = cluster_lib.start_server(cluster, TOWERS)
    # Through ps tasks new variables go there; all-reducing, each worker keeps its own.
    placer = cluster_lib.ParameterServerPlacer(cluster) if cluster.num_ps else None
    with tf.Graph().as_default():
        with tf.compat.v1.device(placer or f"{cluster.task_device}/device:CPU:0"):
            tf.compat.v1.set_random_seed(5)
            global_step = tf.compat.v1.train.get_or_create_global_step()
            batches = towerlib.saved_position_iterator(
                dataset(cluster.replica_index, cluster.num_replicas))
            inputs = batches.get_next()
        graph = cluster_lib.build_sync_train_graph(
            tower, inputs, tf.compat.v1.train.MomentumOptimizer(0.1, 0.9), cluster,
            num_towers=TOWERS, device_type="cpu", global_step=global_step,
            bn_mode="all_towers" if placer else "sync", device_function=placer,
            update=towerlib.ParameterServer() if placer else towerlib.Replicated(),
            summaries=False)
        step, loss = cluster_lib.run_distributed_training(
            graph, server, train_dir=train_dir, max_steps=max_steps, hooks=[PrintSteps()],
            startup_timeout_secs=120, step_deadline_secs=60,
            save_checkpoint_steps=SAVE_STEPS, log_every_n_steps=1000)
    print(f"finished: global_step={step} loss={loss:.6f}", flush=True)


def task_name():
    task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {})
    return f"{task.get('type', 'worker')} {task.get('index', '?')}"


if __name__ == "__main__":
    cluster_lib.exit_by_meaning(main, task=task_name)

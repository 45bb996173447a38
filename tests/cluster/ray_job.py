"""The training function of a Ray Train job running towerlib's all-reduce (tests/cluster/test_ray_train).

Ray Train's TensorflowTrainer starts one actor process per worker and writes each
one's TF_CONFIG ({"cluster": {"worker": [...]}, "task": {"type": "worker", "index":
rank}}); `train_loop` reads it with towerlib.cluster.resolve_cluster() and trains
2 virtual CPU towers per worker, all-reduced over both workers. Each worker's input
is its own shard through towerlib.saved_position_iterator, so a checkpoint holds the
input's position and a resumed run reads what an uninterrupted one would.

Nothing is caught: a lost peer raises towerlib.cluster.WorkerLostError out of the
function, which Ray Train counts as a worker failure and, under
FailureConfig(max_failures=...), answers by restarting every worker, each with a new
TF_CONFIG; they resume from the newest checkpoint all of them have in train_dir.

config (train_loop_config):
  train_dir: the chief's checkpoint folder (worker r: train_dir/worker_r).
  events: a file every worker appends one line to per event, "EVENT rank pid
    global_step unix_time": "start" once its session is ready (the step restored
    from), "step" after each step, "kill" just before it kills itself.
  kill_rank, kill_at_step, kill_marker (optional): worker kill_rank SIGKILLs its
    own process after step kill_at_step, once: the marker file, created first,
    says it already happened, so the restarted worker does not do it again.
"""

import os
import signal
import time

import numpy as np
import tensorflow as tf

import towerlib
from towerlib import cluster as cluster_lib

NUM_TOWERS = 2
MAX_STEPS = 20
SAVE_CHECKPOINT_STEPS = 4
GLOBAL_BATCH = 12          # 6 rows a worker, 3 a tower
FEATURES = 5


def examples(replica_index, num_replicas):
    """This worker's rows: every num_replicas-th row of one fixed table, repeated."""
    rng = np.random.RandomState(11)
    rows = MAX_STEPS * GLOBAL_BATCH
    features = rng.normal(size=(rows, FEATURES)).astype(np.float32)
    targets = (features @ rng.normal(size=(FEATURES, 1))).astype(np.float32)
    dataset = tf.data.Dataset.from_tensor_slices((features, targets))
    return dataset.shard(num_replicas, replica_index).repeat().batch(
        GLOBAL_BATCH // num_replicas, drop_remainder=True)


def tower(inputs, ctx):
    features, targets = inputs
    w1 = tf.compat.v1.get_variable("w1", [FEATURES, 4])
    hidden = towerlib.batch_norm(tf.matmul(features, w1), ctx, name="bn", momentum=0.8)
    w2 = tf.compat.v1.get_variable("w2", [4, 1])
    return tf.reduce_mean(tf.square(tf.matmul(tf.nn.tanh(hidden), w2) - targets))


def _append(path, line):
    with open(path, "a") as events:   # one short write: whole lines under O_APPEND
        events.write(line + "\n")


class Events(tf.compat.v1.train.SessionRunHook):
    """Writes the events above; kills this process once at the step it is told."""

    def __init__(self, config, rank):
        self._config = config
        self._rank = rank

    def begin(self):
        self._global_step = tf.compat.v1.train.get_global_step()

    def _event(self, name, step):
        _append(self._config["events"],
                f"{name} {self._rank} {os.getpid()} {step} {time.time():.6f}")

    def after_create_session(self, session, coord):
        self._event("start", session.run(self._global_step))

    def after_run(self, run_context, run_values):
        step = run_context.session.run(self._global_step)
        self._event("step", step)
        config = self._config
        if (self._rank == config.get("kill_rank") and step >= config["kill_at_step"]
                and self._first_time(config["kill_marker"])):
            self._event("kill", step)
            os.kill(os.getpid(), signal.SIGKILL)

    @staticmethod
    def _first_time(marker):
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        return True


def train_loop(config):
    """Ray Train's train_loop_per_worker: one worker of the all-reduce job."""
    cluster = cluster_lib.resolve_cluster()   # Ray Train's TF_CONFIG
    rank = cluster.replica_index
    server = cluster_lib.start_server(cluster, NUM_TOWERS)
    with tf.Graph().as_default():
        tf.compat.v1.set_random_seed(5)   # the same initial weights in every run
        batches = towerlib.saved_position_iterator(
            examples(rank, cluster.num_replicas)).get_next()
        graph = cluster_lib.build_sync_train_graph(
            tower, batches, tf.compat.v1.train.MomentumOptimizer(0.05, 0.9), cluster,
            num_towers=NUM_TOWERS, device_type="cpu", bn_mode="sync",
            update=towerlib.Replicated())
        cluster_lib.run_distributed_training(
            graph, server, train_dir=config["train_dir"], max_steps=MAX_STEPS,
            hooks=[Events(config, rank)], save_checkpoint_steps=SAVE_CHECKPOINT_STEPS,
            startup_timeout_secs=60, step_deadline_secs=20)

"""The training function of an elastic Ray Train job (tests/cluster/test_ray_elastic).

Ray Train (ScalingConfig(num_workers=(min, max))) starts however many workers it
can place and writes each one's TF_CONFIG for that count; `train_loop` reads it and
trains 2 virtual CPU towers per worker, all-reduced over every worker, on a global
batch fixed by the step whatever the worker count (tests/launch/elastic_job.py's
input: its own rows, or towerlib.global_batch_input). A lost peer raises
WorkerLostError out of the function; Ray restarts the workers it can get, which
resume from the newest checkpoint all of them have.

config (train_loop_config):
  train_dir, max_steps: the chief's checkpoint folder (worker r: train_dir/worker_r),
    the step to end at.
  input: 'step_rows' or 'global_batch' (elastic_job.py).
  events: a file every worker appends one line to per event,
    "EVENT rank pid global_step workers node_id unix_time": "start" once its
    session is ready (the step restored from), "step" after each step, "kill"
    just before it kills itself.
  kill_rank, kill_at_step, kill_marker (optional): worker kill_rank SIGKILLs its
    own process after step kill_at_step, once (the marker file says it happened).
  hold_alone_at_step, hold_secs (optional): a worker running alone (a cluster of
    one) waits after each step from hold_alone_at_step on, up to hold_secs in
    all, so that Ray has the time to grow the job back before it ends.
"""

import os
import signal
import time

import tensorflow as tf

import towerlib
from tests.launch import elastic_job
from towerlib import cluster as cluster_lib

NUM_TOWERS = elastic_job.TOWERS
SAVE_CHECKPOINT_STEPS = elastic_job.SAVE_STEPS


class Events(tf.compat.v1.train.SessionRunHook):
    """Writes the events above; kills or holds this process where it is told."""

    def __init__(self, config, cluster, node):
        self._config, self._cluster, self._node = config, cluster, node
        self._held_secs = 0.0

    def begin(self):
        self._global_step = tf.compat.v1.train.get_global_step()

    def _event(self, name, step):
        line = (f"{name} {self._cluster.replica_index} {os.getpid()} {step} "
                f"{self._cluster.num_replicas} {self._node} {time.time():.6f}\n")
        with open(self._config["events"], "a") as events:   # whole lines under O_APPEND
            events.write(line)

    def after_create_session(self, session, coord):
        self._event("start", session.run(self._global_step))

    def after_run(self, run_context, run_values):
        step = run_context.session.run(self._global_step)
        self._event("step", step)
        config = self._config
        if (self._cluster.replica_index == config.get("kill_rank")
                and step >= config["kill_at_step"] and _first_time(config["kill_marker"])):
            self._event("kill", step)
            os.kill(os.getpid(), signal.SIGKILL)
        if (self._cluster.num_replicas == 1 and "hold_alone_at_step" in config
                and step >= config["hold_alone_at_step"]):
            while self._held_secs < config["hold_secs"]:   # Ray stops this process
                time.sleep(0.25)
                self._held_secs += 0.25
        time.sleep(0.1)   # room between steps, as a real step's time


def _first_time(marker):
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def train_loop(config):
    """Ray Train's train_loop_per_worker: one worker of the elastic all-reduce job."""
    import ray  # in a Ray worker: its node, for the test to take away

    cluster = cluster_lib.resolve_cluster()   # Ray Train's TF_CONFIG, this attempt's count
    server = cluster_lib.start_server(cluster, NUM_TOWERS)
    node = ray.get_runtime_context().get_node_id()
    with tf.Graph().as_default():
        with tf.compat.v1.device(f"{cluster.task_device}/device:CPU:0"):
            tf.compat.v1.set_random_seed(5)   # the same initial weights in every run
            global_step = tf.compat.v1.train.get_or_create_global_step()
            inputs = (elastic_job.step_rows(cluster, global_step)
                      if config["input"] == "step_rows" else elastic_job.library_rows(cluster))
        graph = cluster_lib.build_sync_train_graph(
            elastic_job.tower, inputs, tf.compat.v1.train.MomentumOptimizer(0.05, 0.9),
            cluster, num_towers=NUM_TOWERS, device_type="cpu", global_step=global_step,
            bn_mode="sync", update=towerlib.Replicated(), summaries=False)
        cluster_lib.run_distributed_training(
            graph, server, train_dir=config["train_dir"], max_steps=config["max_steps"],
            hooks=[Events(config, cluster, node)],
            save_checkpoint_steps=SAVE_CHECKPOINT_STEPS, startup_timeout_secs=60,
            step_deadline_secs=30, log_every_n_steps=1000)

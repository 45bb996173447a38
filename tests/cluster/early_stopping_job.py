"""One worker of a 2-worker all-reduce job with early stopping (tests/cluster/test_early_stopping).

    python early_stopping_job.py --task=0 --ports=P0,P1 --train_dir=DIR

The model of tests/run/test_evaluation_loop.py: w trained towards 1 (w = 1 - 0.9^t),
scored -(w - 0.5)^2 every 2 steps, patience 2: the definition stops at step 10.
"""

import argparse
import os
import signal
import time

import numpy as np
import tensorflow as tf

import towerlib
from towerlib import cluster as cluster_lib


def tower(inputs, ctx):
    w = tf.compat.v1.get_variable("w", [], initializer=tf.zeros_initializer())
    return tf.reduce_mean(tf.square(w - inputs[:, 0]))


def score(inputs, ctx):
    return {"score": -tf.square(tf.compat.v1.get_variable("w", []) - inputs[:, 0])}


class Slow(tf.compat.v1.train.SessionRunHook):
    """Sleeps after each step; with die_before_step, SIGKILLs this process just before
    running that step (the checkpoint of the step before is then saved)."""

    def __init__(self, die_before_step=0):
        self.ran, self.die_before_step = 0, die_before_step

    def before_run(self, run_context):
        if self.die_before_step and self.ran + 1 == self.die_before_step:
            os.kill(os.getpid(), signal.SIGKILL)

    def after_run(self, run_context, run_values):
        self.ran += 1
        time.sleep(0.3)


def main(args):
    cluster = cluster_lib.cluster_from_flags(
        worker_hosts=",".join(f"127.0.0.1:{p}" for p in args.ports.split(",")),
        job_name="worker", task_index=args.task)
    server = cluster_lib.start_server(cluster, 2)
    with tf.Graph().as_default():
        graph = cluster_lib.build_sync_train_graph(
            tower, tf.ones([4, 1]), tf.compat.v1.train.GradientDescentOptimizer(0.05),
            cluster, num_towers=2, update=towerlib.Replicated())
        batches = tf.compat.v1.data.make_initializable_iterator(
            tf.data.Dataset.from_tensor_slices(np.full([6, 1], 0.5, np.float32)).batch(6))
        evaluation = towerlib.Evaluation(
            towerlib.build_eval_graph(score, batches.get_next(), num_towers=2,
                                      reuse_variables=True),
            every_n_steps=2, metric="score", initializer=batches.initializer, patience=2)
        result = cluster_lib.run_distributed_training(
            graph, server, train_dir=args.train_dir, max_steps=100, hooks=[Slow(args.die_before_step)],
            evaluation=evaluation, save_checkpoint_steps=2, startup_timeout_secs=60,
            step_deadline_secs=30)
    print(f"finished: global_step={result.global_step} "
          f"stopped_early_at={result.stopped_early_at}", flush=True)
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--task", type=int)
    parser.add_argument("--ports")
    parser.add_argument("--train_dir")
    parser.add_argument("--die_before_step", type=int, default=0)
    arguments = parser.parse_args()
    cluster_lib.exit_by_meaning(lambda: main(arguments), task=f"worker {arguments.task}")

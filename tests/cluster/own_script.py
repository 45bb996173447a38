"""A user's own training script, shaped as docs/distributed.md shows, for the exit statuses.

    python own_script.py TRAIN_DIR MAX_STEPS [STARTUP_TIMEOUT_SECS]

One machine without TF_CONFIG; else the worker TF_CONFIG names, all-reduce. A tiny
linear model; every step sleeps 0.1 s so that a test can signal it mid-run.
"""

import sys
import time

import tensorflow as tf

import towerlib
from towerlib import cluster as cluster_lib


def tower(inputs, ctx):
    features, targets = inputs
    weights = tf.compat.v1.get_variable("w", [4, 1], initializer=tf.zeros_initializer())
    return tf.reduce_mean(tf.square(tf.matmul(features, weights) - targets))


class Slow(tf.compat.v1.train.SessionRunHook):
    def after_run(self, run_context, run_values):
        time.sleep(0.1)


def main():
    train_dir, max_steps = sys.argv[1], int(sys.argv[2])
    startup = float(sys.argv[3]) if len(sys.argv) > 3 else 60.0
    cluster = cluster_lib.resolve_cluster()
    with tf.Graph().as_default():
        return train(cluster, train_dir, max_steps, startup)


def train(cluster, train_dir, max_steps, startup):
    inputs = (tf.ones([8, 4]), tf.ones([8, 1]))
    optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.01)
    if cluster is None:
        train = towerlib.build_train_graph(tower, inputs, optimizer, num_towers=2)
        return towerlib.run_training(train, train_dir=train_dir, max_steps=max_steps,
                                     hooks=[Slow()], session_config=towerlib.session_config(2))
    server = cluster_lib.start_server(cluster, 2)
    graph = cluster_lib.build_sync_train_graph(
        tower, inputs, optimizer, cluster, num_towers=2, update=towerlib.Replicated())
    return cluster_lib.run_distributed_training(
        graph, server, train_dir=train_dir, max_steps=max_steps, hooks=[Slow()],
        startup_timeout_secs=startup)


if __name__ == "__main__":
    cluster_lib.exit_by_meaning(main, task="trainer")

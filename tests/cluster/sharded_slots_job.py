"""One worker of a 2 x 1 job whose Adam slots are sharded over the workers.

    python sharded_slots_job.py --task=1 --ports=P0,P1 --train_dir=DIR [--spike_from=3]
        [--max_steps=8] [--sleep_secs_per_step=0] [--step_deadline_secs=15]
        [--save_checkpoint_steps=1]

The model has two weights, 'a' and 'b', so each worker owns the slots of one.
With --spike_from=S, 'a' gets a gradient of 1e30 from global step S on: Adam's
second moment of 'a' overflows to Inf, while 'a' itself stays finite (its
update is m / sqrt(Inf) = 0) and so does the loss, so only the worker owning
'a''s slots holds a non-finite value. Prints
'stopped: <exception class>: <message>' and exits 3 when training raised,
'finished at step N' otherwise (tests/cluster/test_allreduce_faults.py).
"""

import argparse
import sys
import time

import numpy as np
import tensorflow as tf

import towerlib
from towerlib import cluster as cluster_lib


def tower_fn(spike_from):
    def model(inputs, ctx):
        a = tf.compat.v1.get_variable("a", [3, 1])
        b = tf.compat.v1.get_variable("b", [3, 1])
        loss = tf.reduce_mean(tf.matmul(inputs, a) + tf.matmul(inputs, b))
        if spike_from >= 0:
            step = tf.compat.v1.train.get_global_step()
            loss += tf.where(step >= spike_from, 1e30, 0.0) * tf.reduce_sum(a)
        return loss
    return model


class Sleep(tf.compat.v1.train.SessionRunHook):
    def __init__(self, secs):
        self.secs = secs

    def after_run(self, run_context, run_values):
        time.sleep(self.secs)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--task", type=int)
    parser.add_argument("--ports")
    parser.add_argument("--train_dir")
    parser.add_argument("--spike_from", type=int, default=-1)
    parser.add_argument("--max_steps", type=int, default=8)
    parser.add_argument("--sleep_secs_per_step", type=float, default=0.0)
    parser.add_argument("--step_deadline_secs", type=float, default=15.0)
    parser.add_argument("--save_checkpoint_steps", type=int, default=1)
    args = parser.parse_args()
    cluster = cluster_lib.cluster_from_flags(
        worker_hosts=",".join(f"127.0.0.1:{p}" for p in args.ports.split(",")),
        job_name="worker", task_index=args.task)
    server = cluster_lib.start_server(cluster, 1)
    with tf.Graph().as_default():
        with tf.device(cluster.task_device):
            step = tf.compat.v1.train.get_or_create_global_step()
            batch = tf.constant(np.ones([2, 3], np.float32))
        graph = cluster_lib.build_sync_train_graph(
            tower_fn(args.spike_from), batch, tf.compat.v1.train.AdamOptimizer(0.01),
            cluster, num_towers=1, device_type="cpu", global_step=step,
            update=towerlib.Replicated(shard_update=True))
        try:
            result = cluster_lib.run_distributed_training(
                graph, server, train_dir=args.train_dir, max_steps=args.max_steps,
                hooks=[Sleep(args.sleep_secs_per_step)],
                save_checkpoint_steps=args.save_checkpoint_steps, log_every_n_steps=1,
                step_deadline_secs=args.step_deadline_secs, startup_timeout_secs=40)
        except Exception as error:  # pylint: disable=broad-except
            print(f"stopped: {type(error).__name__}: {error}", flush=True)
            sys.exit(3)
    print(f"finished at step {result.global_step}", flush=True)


if __name__ == "__main__":
    main()

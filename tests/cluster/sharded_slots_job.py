"""One worker of a 2 x 1 job whose Adam slots are sharded over the workers, and
whose weight 'a' gets a gradient of 1e30 from global step 3 on.

    python sharded_inf_slot_job.py --task=1 --ports=P0,P1 --train_dir=DIR

Adam's second moment of 'a' overflows to Inf (1e30 squared), while 'a' itself
stays finite (its update is m / sqrt(Inf) = 0) and so does the loss: only the
worker owning 'a''s slots holds a non-finite value. Prints 'stopped: <exception
class>: <message>' and exits 3 when training raised, 'finished' otherwise
(tests/cluster/test_allreduce_faults.py).
"""

import argparse
import sys

import numpy as np
import tensorflow as tf

import towerlib
from towerlib import cluster as cluster_lib

SPIKE_FROM_STEP = 3


def model(inputs, ctx):
    a = tf.compat.v1.get_variable("a", [3, 1])
    b = tf.compat.v1.get_variable("b", [3, 1])
    spike = tf.where(tf.compat.v1.train.get_global_step() >= SPIKE_FROM_STEP, 1e30, 0.0)
    return tf.reduce_mean(tf.matmul(inputs, a) + tf.matmul(inputs, b)) + \
        spike * tf.reduce_sum(a)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--task", type=int)
    parser.add_argument("--ports")
    parser.add_argument("--train_dir")
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
            model, batch, tf.compat.v1.train.AdamOptimizer(0.01), cluster,
            num_towers=1, device_type="cpu", global_step=step,
            update=towerlib.Replicated(shard_update=True))
        try:
            cluster_lib.run_distributed_training(
                graph, server, train_dir=args.train_dir, max_steps=8,
                save_checkpoint_steps=1, step_deadline_secs=15, startup_timeout_secs=40)
        except Exception as error:  # pylint: disable=broad-except
            print(f"stopped: {type(error).__name__}: {error}", flush=True)
            sys.exit(3)
    print("finished", flush=True)


if __name__ == "__main__":
    main()

"""One worker of an all-reduce job whose worker 1 reads NaN from global step 3 on.

    python allreduce_nan_job.py --task=1 --ports=P0,P1 --train_dir=DIR

Prints 'stopped: <exception class>: <first line>' and exits 3 when training
raised, 'finished' otherwise (tests/cluster/test_allreduce_faults.py).
"""

import argparse
import sys

import numpy as np
import tensorflow as tf

import towerlib
from towerlib import cluster as cluster_lib


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
            data = np.ones([10, 2, 3], np.float32)
            if args.task == 1:
                data[3:] = np.nan  # the batches of global steps 3, 4, ...
            batch = tf.gather(tf.constant(data), tf.minimum(step, 9))

        def model(inputs, ctx):
            weights = tf.compat.v1.get_variable("w", [3, 1])
            return tf.reduce_mean(tf.matmul(inputs, weights))

        graph = cluster_lib.build_sync_train_graph(
            model, batch, tf.compat.v1.train.GradientDescentOptimizer(0.1), cluster,
            num_towers=1, device_type="cpu", global_step=step, update=towerlib.Replicated())
        try:
            cluster_lib.run_distributed_training(
                graph, server, train_dir=args.train_dir, max_steps=8,
                save_checkpoint_steps=1, step_deadline_secs=15, startup_timeout_secs=40)
        except Exception as error:  # pylint: disable=broad-except
            print(f"stopped: {type(error).__name__}: {str(error).splitlines()[0]}", flush=True)
            sys.exit(3)
    print("finished", flush=True)


if __name__ == "__main__":
    main()

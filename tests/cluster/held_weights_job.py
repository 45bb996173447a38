"""One worker of a held-weights run (tests/cluster/test_held_weights_across_workers.py).

    python held_weights_job.py --task=1 --ports=P0,P1 --weights=base.h5 --out=w1.npz

Its tf_keras model function loads --weights (none when empty); every worker
initializes, the chief's values are broadcast, and every variable and
replicated copy is saved to --out.
"""

import argparse

import numpy as np
import tensorflow as tf
import tf_keras

import towerlib
from towerlib import cluster as cluster_lib


def small_model():
    inputs = tf_keras.Input((4,))
    h = tf_keras.layers.Dense(3, name="hidden")(inputs)
    h = tf_keras.layers.BatchNormalization(name="bn")(h)
    return tf_keras.Model(inputs, tf_keras.layers.Dense(2, name="logits")(h))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--task", type=int)
    parser.add_argument("--ports")
    parser.add_argument("--weights", default="")
    parser.add_argument("--out")
    args = parser.parse_args()
    cluster = cluster_lib.cluster_from_flags(
        worker_hosts=",".join(f"127.0.0.1:{p}" for p in args.ports.split(",")),
        job_name="worker", task_index=args.task)
    server = cluster_lib.start_server(cluster, 2)

    def model():
        built = small_model()
        if args.weights:
            built.load_weights(args.weights)
        return built

    def loss(labels, logits):
        return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)

    with tf.Graph().as_default():
        batch = (tf.ones([8, 4]), tf.zeros([8], tf.int32))
        graph = cluster_lib.build_sync_train_graph(
            towerlib.KerasTower(model, loss), batch,
            tf.compat.v1.train.GradientDescentOptimizer(0.1), cluster, num_towers=2,
            device_type="cpu", bn_mode="sync", update=towerlib.Replicated())
        variables = tf.compat.v1.global_variables() + tf.compat.v1.local_variables()
        with tf.compat.v1.Session(server.target,
                                  config=cluster_lib.session_config(cluster, 2)) as session:
            graph.train_graph.initialize(session)
            np.savez(args.out, **dict(zip([v.op.name for v in variables],
                                          session.run(variables))))


if __name__ == "__main__":
    main()

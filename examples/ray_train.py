r"""Ray Train runs towerlib's all-reduce: every worker restarted together after a failure.

    pip install -e '.[ray]'          # from a clone: ray[train] >= 2.60 (Ray Train V2)
    python examples/ray_train.py --train_dir=/tmp/ray_run

Ray Train's TensorflowTrainer starts one process per worker and writes each one's
TF_CONFIG; `train_loop` reads it with towerlib.cluster.resolve_cluster() and trains
--num_towers virtual CPU towers (or GPUs) per worker, the gradients all-reduced over
every tower of every worker. A lost worker raises towerlib.cluster.WorkerLostError out
of `train_loop`; Ray counts that failure and, under FailureConfig(max_failures=...),
restarts every worker, which resume from the newest checkpoint in --train_dir.

Without --address the script starts a Ray cluster of its own on this machine, on
loopback only (127.0.0.1: TF_CONFIG names that address; TensorFlow's servers still
listen on every interface), and shuts it down at the end. With --address it joins
yours, where every node must see --train_dir.

The data is synthetic: a fixed table of rows, each worker reading its own shard through
towerlib.saved_position_iterator, so a checkpoint holds the input's position.
"""

import os
import sys

import numpy as np
import tensorflow as tf
from absl import app, flags

import towerlib
from towerlib import cluster as cluster_lib

flags.DEFINE_string("train_dir", None, "Checkpoints (worker r also writes train_dir/worker_r).")
flags.DEFINE_string("address", "", "A Ray cluster to join; empty: start one on loopback.")
flags.DEFINE_integer("num_workers", 2, "Ray Train workers, one process each.")
flags.DEFINE_integer("num_towers", 2, "Towers per worker (virtual CPUs without GPUs).")
flags.DEFINE_integer("max_steps", 20, "The global step to stop at.")
flags.DEFINE_integer("max_failures", 3, "Restarts of every worker Ray may make.")
flags.DEFINE_string("storage_path", "", "Ray Train's results; empty: <train_dir>/ray_results.")
flags.mark_flag_as_required("train_dir")
FLAGS = flags.FLAGS

FEATURES, GLOBAL_BATCH = 5, 16


def examples(replica_index, num_replicas, max_steps):
    """This worker's rows: every num_replicas-th row of one fixed table, repeated."""
    rng = np.random.RandomState(11)
    features = rng.normal(size=(max_steps * GLOBAL_BATCH, FEATURES)).astype(np.float32)
    targets = (features @ rng.normal(size=(FEATURES, 1))).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((features, targets)).shard(
        num_replicas, replica_index).repeat().batch(GLOBAL_BATCH // num_replicas,
                                                    drop_remainder=True)


def model(inputs, ctx):
    """The tower function: a small regression net with batch norm."""
    features, targets = inputs
    w1 = tf.compat.v1.get_variable("w1", [FEATURES, 8])
    hidden = towerlib.batch_norm(tf.matmul(features, w1), ctx, name="bn", momentum=0.9)
    w2 = tf.compat.v1.get_variable("w2", [8, 1])
    return tf.reduce_mean(tf.square(tf.matmul(tf.nn.tanh(hidden), w2) - targets))


def train_loop(config):
    """Ray Train's train_loop_per_worker: one worker of the all-reduce job."""
    cluster = cluster_lib.resolve_cluster()   # the TF_CONFIG Ray Train wrote
    server = cluster_lib.start_server(cluster, config["num_towers"])
    with tf.Graph().as_default():
        batches = towerlib.saved_position_iterator(examples(
            cluster.replica_index, cluster.num_replicas, config["max_steps"])).get_next()
        graph = cluster_lib.build_sync_train_graph(
            model, batches, tf.compat.v1.train.MomentumOptimizer(0.01, 0.9), cluster,
            num_towers=config["num_towers"], update=towerlib.Replicated())
        # A lost worker raises WorkerLostError here: let it propagate, Ray restarts all.
        result = cluster_lib.run_distributed_training(
            graph, server, train_dir=config["train_dir"], max_steps=config["max_steps"],
            save_checkpoint_steps=10)
    print(f"worker {cluster.replica_index} of {cluster.num_replicas} at "
          f"{cluster.cluster_spec.as_dict()['worker'][cluster.replica_index]}: finished at "
          f"global step {result.global_step}", flush=True)


def fit(config, storage_path):
    """One TensorflowTrainer run of train_loop; returns Ray Train's Result."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig  # after ray.init
    from ray.train.tensorflow import TensorflowTrainer

    return TensorflowTrainer(
        train_loop, train_loop_config=config,   # train_dir: every node must see it
        scaling_config=ScalingConfig(num_workers=FLAGS.num_workers),  # GPUs: use_gpu=True
        run_config=RunConfig(name="towerlib", storage_path=storage_path,
                             failure_config=FailureConfig(max_failures=FLAGS.max_failures)),
    ).fit()


def main(argv):
    del argv
    train_dir = os.path.abspath(FLAGS.train_dir)
    config = {"train_dir": train_dir, "num_towers": FLAGS.num_towers,
              "max_steps": FLAGS.max_steps}
    if not FLAGS.address:
        # Ray's switch for a one-machine cluster on loopback: the node's address, and
        # so every worker's TF_CONFIG, is 127.0.0.1 instead of the network interface's.
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray

    ray.init(address=FLAGS.address or None, include_dashboard=False,
             configure_logging=False,
             **({} if FLAGS.address else {"num_cpus": FLAGS.num_workers + 1}))
    try:
        result = fit(config, FLAGS.storage_path or os.path.join(train_dir, "ray_results"))
    finally:
        ray.shutdown()
    if result.error is not None:
        print(f"ray_train: training failed: {result.error}", file=sys.stderr)
        return 1
    print(f"finished: {FLAGS.num_workers} workers at global step {FLAGS.max_steps}; "
          f"checkpoints in {train_dir}", flush=True)
    return 0


if __name__ == "__main__":
    app.run(lambda argv: sys.exit(main(argv)))

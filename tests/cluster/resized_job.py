"""One process of a resized-run test (tests/cluster/test_resized_runs.py).

    python resized_job.py --workers=2 --task=1 --ports=P0,P1 --towers=2 --train_dir=D ...
    python resized_job.py --workers=1 --towers=4 --train_dir=D ...   # one machine

Trains a small model (dense, towerlib batch norm in 'sync' mode, dense; or
without batch norm; in float32 or float16 with its loss scale; evaluated
every 5 steps or not) with Momentum and towerlib.Replicated() on a fixed table
of examples until --max_steps, resuming from what --train_dir holds. The
input is either towerlib.global_batch_input ('global': the global batch of a
step is fixed by the seed and the position; 'tfrecords': the same over the
table written as TFRecord shards in --data_dir, read by index) or the
shard-then-shuffle input
the CIFAR-10 example used ('sharded': each worker shuffles its own shard,
and a restart starts it from its beginning). The test reads the checkpoints.
"""

import argparse

import numpy as np
import tensorflow as tf

import towerlib
from towerlib import cluster as cluster_lib

EXAMPLES = 40
GLOBAL_BATCH = 8
FEATURES = 6
CLASSES = 3
SEED = 1


def table():
    rng = np.random.RandomState(5)
    return (rng.normal(size=(EXAMPLES, FEATURES)).astype(np.float32),
            rng.randint(0, CLASSES, size=EXAMPLES).astype(np.int32))


def logits_of(x, ctx, batch_norm):
    w1 = tf.compat.v1.get_variable(
        "w1", [FEATURES, 5], initializer=tf.compat.v1.glorot_uniform_initializer(seed=1))
    h = tf.matmul(x, w1)
    if batch_norm:
        h = towerlib.batch_norm(h, ctx, name="bn", momentum=0.8)
    w2 = tf.compat.v1.get_variable(
        "w2", [5, CLASSES], initializer=tf.compat.v1.glorot_uniform_initializer(seed=2))
    return tf.matmul(tf.nn.tanh(h), w2)


def tower_fn(batch_norm):
    def model(inputs, ctx):
        x, y = inputs
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=y, logits=tf.cast(logits_of(x, ctx, batch_norm), tf.float32)))
    return model


def evaluation(batch_norm, devices):
    """Every 5 steps: the cross-entropy of the first 12 examples, lower is better."""
    def metric_fn(inputs, ctx):
        x, y = inputs
        logits = tf.cast(logits_of(x, ctx, batch_norm), tf.float32)
        return {"xent": tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y,
                                                                        logits=logits)}
    images, labels = table()
    eval_graph = towerlib.build_eval_graph(
        metric_fn, (tf.constant(images[:12]), tf.constant(labels[:12])), devices=devices,
        reuse_variables=True)
    return towerlib.Evaluation(eval_graph, 5, "xent", higher_is_better=False,
                               num_batches=1, keep_best=False, patience=100)


def inputs(kind, group, data_dir=None):
    if kind == "global":
        return towerlib.global_batch_input(table(), GLOBAL_BATCH, seed=SEED, workers=group)
    if kind == "tfrecords":
        from tests.data.record_files import decode
        source = towerlib.TFRecords(f"{data_dir}/train-*.tfrecord", decode=decode)
        return towerlib.global_batch_input(source, GLOBAL_BATCH, seed=SEED, workers=group)
    base, extra = divmod(GLOBAL_BATCH, group.num_workers)
    size = base + (1 if group.worker_index < extra else 0)
    dataset = tf.data.Dataset.from_tensor_slices(table()).shard(
        group.num_workers, group.worker_index)
    dataset = dataset.shuffle(EXAMPLES, seed=SEED).repeat().batch(size, drop_remainder=True)
    return tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--task", type=int, default=0)
    parser.add_argument("--ports", default="")
    parser.add_argument("--towers", type=int, default=1)
    parser.add_argument("--accumulation_steps", type=int, default=1)
    parser.add_argument("--batch_norm", type=int, default=1)
    parser.add_argument("--input", choices=["global", "sharded", "tfrecords"],
                        default="global")
    parser.add_argument("--data_dir", default=None)
    parser.add_argument("--float16", type=int, default=0)
    parser.add_argument("--evaluate", type=int, default=0)
    parser.add_argument("--shard_update", type=int, default=0)
    parser.add_argument("--train_dir", required=True)
    parser.add_argument("--max_steps", type=int, required=True)
    args = parser.parse_args()
    tf.compat.v1.set_random_seed(3)
    options = dict(bn_mode="sync", summaries=False,
                   update=towerlib.Replicated(shard_update=bool(args.shard_update)),
                   accumulation_steps=args.accumulation_steps)
    if args.float16:
        options["precision"] = towerlib.Float16()
    optimizer = tf.compat.v1.train.MomentumOptimizer(0.1, 0.9)
    loop = dict(train_dir=args.train_dir, max_steps=args.max_steps, log_every_n_steps=1,
                save_checkpoint_steps=10, save_summaries_steps=None)
    model = tower_fn(bool(args.batch_norm))
    if args.workers == 1:
        with tf.Graph().as_default():
            batch = inputs(args.input, towerlib.WorkerGroup(1, 0), args.data_dir)
            train = towerlib.build_train_graph(model, batch, optimizer,
                                               num_towers=args.towers, device_type="cpu",
                                               **options)
            if args.evaluate:
                loop["evaluation"] = evaluation(bool(args.batch_norm), train.devices)
            result = towerlib.run_training(train, **loop)
    else:
        cluster = cluster_lib.cluster_from_flags(
            worker_hosts=",".join(f"127.0.0.1:{p}" for p in args.ports.split(",")),
            job_name="worker", task_index=args.task)
        server = cluster_lib.start_server(cluster, args.towers)
        with tf.Graph().as_default():
            with tf.device(f"{cluster.task_device}/device:CPU:0"):
                batch = inputs(args.input, cluster.worker_group, args.data_dir)
            graph = cluster_lib.build_sync_train_graph(
                model, batch, optimizer, cluster, num_towers=args.towers,
                device_type="cpu", **options)
            if args.evaluate:
                loop["evaluation"] = evaluation(bool(args.batch_norm),
                                                graph.train_graph.devices)
            result = cluster_lib.run_distributed_training(
                graph, server, startup_timeout_secs=120, step_deadline_secs=120, **loop)
    print("finished", result.global_step, result.loss, flush=True)


if __name__ == "__main__":
    main()

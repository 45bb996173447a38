"""One process of an all-reduce equivalence run (tests/cluster/test_allreduce_training.py).

    python allreduce_job.py --role=worker --task=1 --workers=2 --towers=2 --ports=P0,P1 ...
    python allreduce_job.py --role=reference --towers=4 ...   # one process, W x N towers
    python allreduce_job.py --role=one_device ...             # one tower, whole batch

Every run trains the same small model (dense, towerlib batch norm, dense) for
STEPS steps on fixed batches of GLOBAL_BATCH examples, which do not divide
evenly over the towers. Tower t of the whole job (worker-major) reads the same
rows in every role, through an input function, so the reference with W x N
towers in one process is the single-machine definition of every bn_mode.
The workers start from the chief's values after the broadcast; the chief saves
them, and the other roles load them. Each run saves every variable (and
every tower's copy) to OUT.npz.
"""

import argparse
import os

import numpy as np
import tensorflow as tf

import towerlib
from towerlib import cluster as cluster_lib
from towerlib.update import broadcast

GLOBAL_BATCH = 11
STEPS = 5
FEATURES = 6


def batches():
    rng = np.random.RandomState(7)
    images = rng.normal(size=(STEPS, GLOBAL_BATCH, FEATURES)).astype(np.float32)
    labels = rng.randint(0, 3, size=(STEPS, GLOBAL_BATCH)).astype(np.int32)
    return images, labels


def rows_of_member(member, members):
    """[start, end) of member's rows: the first B mod M members get one more."""
    base, extra = divmod(GLOBAL_BATCH, members)
    sizes = [base + (1 if m < extra else 0) for m in range(members)]
    start = sum(sizes[:member])
    return start, start + sizes[member]


def model(inputs, ctx):
    x, y = inputs
    w1 = tf.compat.v1.get_variable("w1", [FEATURES, 5])
    h = towerlib.batch_norm(tf.matmul(x, w1), ctx, name="bn", momentum=0.8)
    # A weight's regularizer counts once in the step, whatever the workers.
    w2 = tf.compat.v1.get_variable("w2", [5, 3],
                                   regularizer=lambda w: 1e-3 * tf.nn.l2_loss(w))
    logits = tf.matmul(tf.nn.tanh(h), w2)
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=y, logits=logits))


def keras_tower():
    """The same network as `model`, as a tf_keras model (its variables keep Keras' names)."""
    import tf_keras  # only the Keras runs need it

    def build():
        inputs = tf_keras.Input((FEATURES,))
        h = tf_keras.layers.Dense(5, use_bias=False, name="w1")(inputs)
        h = tf_keras.layers.BatchNormalization(name="bn", momentum=0.8)(h)
        h = tf_keras.layers.Activation("tanh")(h)
        logits = tf_keras.layers.Dense(
            3, use_bias=False, name="w2",
            kernel_regularizer=lambda w: 1e-3 * tf.nn.l2_loss(w))(h)
        return tf_keras.Model(inputs, logits)

    def loss(labels, logits):
        return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)

    return towerlib.KerasTower(build, loss)


def optimizer(name):
    return {"sgd": tf.compat.v1.train.GradientDescentOptimizer(0.3),
            "momentum": tf.compat.v1.train.MomentumOptimizer(0.2, 0.9),
            "adam": tf.compat.v1.train.AdamOptimizer(0.01)}[name]


def load_start(session, train, start):
    """Every global variable `start` names set to its value, then copied to every tower
    (a slot sharded over the workers is in its owner's file only)."""
    for variable in tf.compat.v1.global_variables():
        if variable.op.name in start.files:   # a slot the chief did not own: as initialized
            variable.load(start[variable.op.name], session)
    if train.sync_copies_op is not None:
        session.run(train.sync_copies_op)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--role", choices=["worker", "reference", "one_device"])
    parser.add_argument("--task", type=int, default=0)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--towers", type=int, default=1)
    parser.add_argument("--ports", default="")
    parser.add_argument("--cluster", choices=["flags", "environment"], default="flags")
    parser.add_argument("--bn_mode", default="sync")
    parser.add_argument("--optimizer", default="sgd")
    parser.add_argument("--accumulation_steps", type=int, default=1)
    parser.add_argument("--model", choices=["towerlib", "keras"], default="towerlib")
    parser.add_argument("--clip_norm", type=float, default=0.0)
    parser.add_argument("--shard_update", action="store_true")
    parser.add_argument("--batch_sizes", choices=["static", "dynamic"], default="static")
    parser.add_argument("--init", required=True)
    parser.add_argument("--broadcast_chunk_bytes", type=int, default=0,
                        help="The start broadcast's buffer size (0: towerlib's default).")
    parser.add_argument("--start", default="",
                        help="Every worker starts from these values (a chief's --init "
                             "file of another run), not its own initializers.")
    parser.add_argument("--out", required=True)
    run(parser.parse_args())


def run(args):
    """One role's run (args: the flags above, as attributes); the test calls it
    in its own process for the references, which need no server."""
    images, labels = batches()
    step_index = None
    if getattr(args, "broadcast_chunk_bytes", 0):   # read when the build broadcasts
        broadcast.DEFAULT_CHUNK_BYTES = args.broadcast_chunk_bytes
    if args.role == "worker":
        if getattr(args, "cluster", "flags") == "environment":   # TF_CONFIG or Slurm's
            cluster = cluster_lib.resolve_cluster()
            assert cluster.task_index == args.task, (cluster, args.task)
        else:
            cluster = cluster_lib.cluster_from_flags(
                worker_hosts=",".join(f"127.0.0.1:{p}" for p in args.ports.split(",")),
                job_name="worker", task_index=args.task)
        server = cluster_lib.start_server(cluster, args.towers)
        first_member, members = args.task * args.towers, args.workers * args.towers
        target, config = server.target, cluster_lib.session_config(cluster, args.towers)
    else:
        first_member, members = 0, args.towers
        target, config = "", towerlib.session_config(args.towers)

    with tf.Graph().as_default():
        step_index = tf.compat.v1.placeholder(tf.int32, [])
        k = args.accumulation_steps

        def input_fn(ctx):
            start, end = rows_of_member(first_member + ctx.index, members)
            # Micro-batch j of a tower: its rows split in k, the first ones longer.
            bounds = np.linspace(start, end, k + 1).round().astype(int)
            rows = tf.range(bounds[ctx.micro_batch], bounds[ctx.micro_batch + 1])
            if getattr(args, "batch_sizes", "static") == "dynamic":  # known when run
                rows = tf.compat.v1.placeholder_with_default(rows, [None])
            return (tf.gather(tf.gather(tf.constant(images), step_index), rows),
                    tf.gather(tf.gather(tf.constant(labels), step_index), rows))

        clip = getattr(args, "clip_norm", 0.0)
        options = dict(bn_mode=args.bn_mode, accumulation_steps=k, summaries=False,
                       update=towerlib.Replicated(
                           pack_bytes=64, shard_update=getattr(args, "shard_update", False)),
                       clipping=towerlib.ClipByGlobalNorm(clip) if clip else None)
        tower = keras_tower() if getattr(args, "model", "towerlib") == "keras" else model
        if args.role == "worker":
            graph = cluster_lib.build_sync_train_graph(
                tower, input_fn, optimizer(args.optimizer), cluster,
                num_towers=args.towers, device_type="cpu", **options)
            train = graph.train_graph
        else:
            train = towerlib.build_train_graph(
                tower, input_fn, optimizer(args.optimizer), num_towers=args.towers,
                device_type="cpu", **options)
        variables = tf.compat.v1.global_variables() + tf.compat.v1.local_variables()
        with tf.compat.v1.Session(target, config=config) as session:
            train.initialize(session)
            if args.role == "worker" and getattr(args, "start", ""):
                load_start(session, train, np.load(args.start))
            if args.role == "worker" and args.task == 0:
                # Whole or not at all: the test starts the references once it exists.
                np.savez(args.init + ".partial.npz", **{
                    v.op.name: session.run(v) for v in tf.compat.v1.global_variables()})
                os.replace(args.init + ".partial.npz", args.init)
            elif args.role != "worker":
                load_start(session, train, np.load(args.init))
            norm = train.gradient_norm if train.gradient_norm is not None else train.loss
            runs = [session.run([train.train_op, train.loss, norm], {step_index: s})[1:]
                    for s in range(STEPS)]
            losses = [loss for loss, _ in runs]
            np.savez(args.out, losses=np.array(losses), norms=np.array([n for _, n in runs]),
                     **{v.op.name: session.run(v) for v in variables})
    print("losses", losses, flush=True)


if __name__ == "__main__":
    main()

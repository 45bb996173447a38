"""The tower loop by hand, as TF 1's cifar10_multi_gpu_train.py wrote it; then through towerlib.

    python -m examples.tower_loop_by_hand     # trains both ways, prints how far apart they end
    python -m examples.tower_loop_by_hand --num_towers=4 --steps=10   # 4 towers, 10 steps

Part 1 is the classic data-parallel step on today's TensorFlow (tf.compat.v1, no tf.contrib,
no tf.compat.v1.layers), on N virtual CPU devices. Part 2 is the same model through towerlib.
From the same initial weights on the same global batches both end with the same weights
and moving statistics (tests/examples/test_tower_loop_by_hand.py holds them to 1e-5).
"""

import examples.cifar10  # noqa: F401  (first: keeps TensorFlow's start-up lines quiet)

# isort: split
import argparse
import sys

import numpy as np
import tensorflow as tf

import towerlib

UPDATE_OPS = tf.compat.v1.GraphKeys.UPDATE_OPS
MOMENTUM, EPSILON = 0.99, 1e-3  # batch norm's moving-average decay; towerlib's defaults too


def model(images, labels, batch_norm):
    """The mean cross-entropy over these examples. batch_norm(x, name): either part's."""
    def weights(name, shape, seed):  # a fixed seed: every build starts from the same values
        return tf.compat.v1.get_variable(
            name, shape, initializer=tf.compat.v1.glorot_uniform_initializer(seed=seed))

    h = tf.nn.conv2d(images, weights("conv1/weights", [3, 3, 3, 16], 1), 1, "SAME")
    h = tf.nn.relu(batch_norm(h, "bn1"))
    h = tf.nn.conv2d(h, weights("conv2/weights", [3, 3, 16, 16], 2), 1, "SAME")
    h = tf.reduce_mean(tf.nn.relu(batch_norm(h, "bn2")), axis=[1, 2])
    logits = tf.matmul(h, weights("logits/weights", [16, 10], 3))
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=labels, logits=logits))


# --- Part 1: by hand ---------------------------------------------------------------------


def batch_norm_by_hand(x, name):
    """Normalizes with this tower's shard; its moving averages go into UPDATE_OPS."""
    channels = [x.shape[-1]]
    with tf.compat.v1.variable_scope(name):  # created by tower 0, reused by the others
        beta = tf.compat.v1.get_variable("beta", channels, initializer=tf.zeros_initializer())
        gamma = tf.compat.v1.get_variable("gamma", channels, initializer=tf.ones_initializer())
        moving_mean = tf.compat.v1.get_variable(
            "moving_mean", channels, trainable=False, initializer=tf.zeros_initializer())
        moving_variance = tf.compat.v1.get_variable(
            "moving_variance", channels, trainable=False, initializer=tf.ones_initializer())
    mean, variance = tf.nn.moments(x, axes=[0, 1, 2])  # this shard's, the biased variance
    for average, value in ((moving_mean, mean), (moving_variance, variance)):
        # Named under the tower's name scope ('tower_1/...'): the loop collects them by it.
        tf.compat.v1.add_to_collection(UPDATE_OPS, average.assign_sub(
            (average - value) * (1.0 - MOMENTUM), read_value=False))
    return tf.nn.batch_normalization(x, mean, variance, beta, gamma, EPSILON)


def average_gradients(tower_grads):
    """One (mean gradient, variable) per variable; every tower lists them in one order."""
    averaged = []
    for grads_and_vars in zip(*tower_grads):
        grads = [grad for grad, _ in grads_and_vars]
        averaged.append((tf.add_n(grads) / len(grads), grads_and_vars[0][1]))
    return averaged


def train_op_by_hand(global_batch, optimizer, num_towers, bn_updates="first_tower"):
    """One optimizer step per global batch, on devices /cpu:0 ... /cpu:N-1.

    bn_updates: 'first_tower' runs tower 0's UPDATE_OPS (the tutorial's choice: its shard
    stands for the batch); 'all_towers' runs every tower's: N moving-average steps per
    training step, one per shard, racing on the same variables.
    """
    global_step = tf.compat.v1.train.get_or_create_global_step()
    images, labels = (tf.split(tensor, num_towers) for tensor in global_batch)
    tower_grads, update_ops = [], []
    with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope()):
        for i in range(num_towers):  # tower 0 creates the variables on /cpu:0, one copy
            with tf.device(f"/cpu:{i}"), tf.name_scope(f"tower_{i}") as scope:
                loss = model(images[i], labels[i], batch_norm_by_hand)
                tf.compat.v1.get_variable_scope().reuse_variables()  # towers 1.. share them
                tower_grads.append(optimizer.compute_gradients(loss))
                if i == 0 or bn_updates == "all_towers":
                    update_ops += tf.compat.v1.get_collection(UPDATE_OPS, scope)
    with tf.device("/cpu:0"):
        grads_and_vars = average_gradients(tower_grads)
    with tf.control_dependencies(update_ops):  # the step runs the chosen updates too
        return optimizer.apply_gradients(grads_and_vars, global_step=global_step)


# --- Part 2: the same model through towerlib ----------------------------------------------


def train_op_with_towerlib(global_batch, optimizer, num_towers, bn_mode="first_tower"):
    """towerlib splits the batch, builds the towers, averages, applies, runs the updates."""
    def tower_loss(inputs, ctx):  # called once per tower, with its shard and its context
        def batch_norm(x, name):
            return towerlib.batch_norm(x, ctx, name=name, momentum=MOMENTUM, epsilon=EPSILON)
        return model(*inputs, batch_norm)

    return towerlib.build_train_graph(
        tower_loss, global_batch, optimizer, num_towers=num_towers, bn_mode=bn_mode).train_op


# --- Training either way ------------------------------------------------------------------


def labelled_images(count=256):
    """[count, 8, 8, 3] float32 images whose mean tells their label, [count] int32 labels."""
    rng = np.random.RandomState(0)
    labels = rng.randint(0, 10, count).astype(np.int32)
    images = rng.randn(count, 8, 8, 3) + labels[:, None, None, None] / 3.0
    return images.astype(np.float32), labels


def train(build, steps=5, num_towers=2, global_batch=32, **mode):
    """{variable name: value} of the model after `steps` steps of train_op_by_hand or
    train_op_with_towerlib, each step on the next `global_batch` of labelled_images()."""
    with tf.Graph().as_default():
        dataset = tf.data.Dataset.from_tensor_slices(labelled_images()).repeat()
        batch = tf.compat.v1.data.make_one_shot_iterator(dataset.batch(global_batch)).get_next()
        train_op = build(batch, tf.compat.v1.train.MomentumOptimizer(0.1, 0.9), num_towers,
                         **mode)
        model_variables = [v for v in tf.compat.v1.global_variables()
                           if v.op.name.split("/")[0] in ("conv1", "conv2", "bn1", "bn2", "logits")
                           and "Momentum" not in v.op.name]
        # By hand: N CPU devices in the config; towerlib.session_config(N) asks the same.
        config = tf.compat.v1.ConfigProto(device_count={"CPU": num_towers})
        with tf.compat.v1.Session(config=config) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            for _ in range(steps):
                session.run(train_op)
            return {v.op.name: value
                    for v, value in zip(model_variables, session.run(model_variables))}


def largest_difference(a, b):
    return max(float(np.max(np.abs(a[name] - b[name]))) for name in a)


def parse_flags(argv):
    """--num_towers (dividing --global_batch) and --steps (>= 1); a wrong one is one line
    on stderr and status 2."""
    parser = argparse.ArgumentParser(prog="python -m examples.tower_loop_by_hand")
    parser.add_argument("--num_towers", type=int, default=2, help="virtual CPU towers")
    parser.add_argument("--steps", type=int, default=5, help="training steps each way")
    parser.add_argument("--global_batch", type=int, default=32, help="examples a step")

    def refuse(message):
        sys.stderr.write(f"error: {message}\n")
        raise SystemExit(2)

    parser.error = lambda message: refuse(f"{message}. See --help for the flags.")
    flags = parser.parse_args(argv)
    if flags.num_towers < 1 or flags.steps < 1 or flags.global_batch < 1:
        refuse(f"--num_towers={flags.num_towers} --steps={flags.steps} --global_batch="
               f"{flags.global_batch}: each must be at least 1.")
    if flags.global_batch % flags.num_towers:
        refuse(f"--global_batch={flags.global_batch} does not split into "
               f"--num_towers={flags.num_towers} equal shards (the loop by hand uses "
               "tf.split). Fix: a tower count that divides the global batch.")
    return flags


def main(argv):
    flags = parse_flags(argv)
    run = dict(steps=flags.steps, num_towers=flags.num_towers,
               global_batch=flags.global_batch)
    by_hand, with_towerlib = train(train_op_by_hand, **run), \
        train(train_op_with_towerlib, **run)
    print(f"{flags.num_towers} towers, {flags.steps} step(s) of {flags.global_batch} "
          "examples each way")
    print(f"first tower: {len(by_hand)} variables, largest difference "
          f"{largest_difference(by_hand, with_towerlib):.1e}")
    all_by_hand = train(train_op_by_hand, bn_updates="all_towers", **run)
    all_towerlib = train(train_op_with_towerlib, bn_mode="all_towers", **run)
    ratio = (np.linalg.norm(all_by_hand["bn1/moving_mean"])
             / np.linalg.norm(all_towerlib["bn1/moving_mean"]))
    print(f"all towers: bn1's moving mean moved {ratio:.2f}x as far by hand "
          f"({flags.num_towers} updates a step, one per shard) as through towerlib (one "
          "update from the whole batch)")


if __name__ == "__main__":
    main(sys.argv[1:])

"""Shared test models and runners: towerlib on N virtual CPUs vs plain TF on one.

The reference run is plain TensorFlow 1.x code (one device, `minimize`, the
UPDATE_OPS idiom), not towerlib with one tower, so equivalence is checked
against an independent implementation. Both runs start from the same weights,
set by name from one numpy seed, since op-level random seeds depend on the
graph's construction order.
"""

import glob
import os
import subprocess
import sys

import numpy as np
import tensorflow as tf

import towerlib
from towerlib import layers

NUM_CLASSES = 3


def conv_dense_model(inputs, ctx, use_batch_norm=False):
    """[B, 6, 6, 2] images -> 3 classes; conv, (bn), dense, (bn), dense."""
    images, labels = inputs
    h = layers.conv2d(images, 4, 3, name="conv1", weight_decay=1e-3,
                      use_bias=not use_batch_norm)
    if use_batch_norm:
        h = towerlib.batch_norm(h, ctx, name="bn_conv1")
    h = tf.nn.relu(h)
    h = layers.max_pool2d(h, 2, 2)
    h = layers.flatten(h)
    h = layers.dense(h, 8, name="fc1", weight_decay=1e-3, use_bias=not use_batch_norm)
    if use_batch_norm:
        h = towerlib.batch_norm(h, ctx, name="bn_fc1")
    h = tf.nn.relu(h)
    logits = layers.dense(h, NUM_CLASSES, name="logits")
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=labels, logits=logits))


def conv_bn_model(inputs, ctx):
    return conv_dense_model(inputs, ctx, use_batch_norm=True)


def embedding_model(inputs, ctx):
    """ids [B, 3] -> mean embedding -> dense -> 3 classes (sparse gradients)."""
    ids, labels = inputs
    vectors = layers.embedding(ids, 20, 5, name="embed")
    pooled = tf.reduce_mean(vectors, axis=1)
    logits = layers.dense(pooled, NUM_CLASSES, name="logits")
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=labels, logits=logits))


def image_batches(batch_size, steps=5, seed=0, offset=0.0, scale=1.0):
    """`steps` (images, labels) batches drawn one after another from one seed.

    A run that reads a new batch each step trains on these; the first of them
    is image_batch(batch_size, seed, offset, scale).
    """
    rng = np.random.RandomState(seed)
    batches = []
    for _ in range(steps):
        images = (offset + scale * rng.randn(batch_size, 6, 6, 2)).astype(np.float32)
        labels = rng.randint(0, NUM_CLASSES, batch_size).astype(np.int32)
        batches.append((images, labels))
    return batches


def image_batch(batch_size, seed=0, offset=0.0, scale=1.0):
    return image_batches(batch_size, 1, seed, offset, scale)[0]


def id_batch(batch_size, seed=0):
    rng = np.random.RandomState(seed)
    ids = rng.randint(0, 20, (batch_size, 3)).astype(np.int32)
    labels = rng.randint(0, NUM_CLASSES, batch_size).astype(np.int32)
    return ids, labels


def cpu_devices(num_towers):
    return [f"/device:CPU:{i}" for i in range(num_towers)]


def cpu_session(graph, num_cpus):
    """A Session on `num_cpus` virtual CPUs with no other option set.

    For tests of the cross-tower reducer on its own: what they run must not
    depend on what towerlib.session_config adds.
    """
    config = tf.compat.v1.ConfigProto(device_count={"CPU": num_cpus})
    return tf.compat.v1.Session(graph=graph, config=config)


def initial_values(shapes_by_name, seed=123):
    """Deterministic starting values {name: array} (batch-norm ones left alone).

    Args:
      shapes_by_name: {variable name: shape}; the same names give the same values.
    """
    values = {}
    for index, name in enumerate(sorted(shapes_by_name)):
        if name.endswith(("moving_mean", "moving_variance", "gamma", "beta")):
            continue
        rng = np.random.RandomState(seed + index)
        values[name] = (0.3 * rng.randn(*shapes_by_name[name])).astype(np.float32)
    return values


def initial_values_for(variables):
    return initial_values({v.op.name: v.shape.as_list() for v in variables})


def initial_values_like(weights):
    """The starting values of a run whose final weights are `weights`."""
    return initial_values({name: value.shape for name, value in weights.items()})


def load_values(session, variables, values):
    for var in variables:
        if var.op.name in values:
            var.load(values[var.op.name], session)


def model_variables():
    return [v for v in tf.compat.v1.global_variables()
            if "global_step" not in v.op.name
            and "Momentum" not in v.op.name and "ExponentialMovingAverage" not in v.op.name]


def make_optimizer(kind):
    if kind == "sgd":
        return tf.compat.v1.train.GradientDescentOptimizer(0.1)
    return tf.compat.v1.train.MomentumOptimizer(0.1, momentum=0.9)


def build_on_image_batch(num_cpu_towers=None, tower_fn=conv_bn_model, inputs=None,
                         batch_size=8, optimizer_kind="sgd", **options):
    """towerlib.build_train_graph in the current graph on one constant image batch.

    For the tests that look at what building does (variables, ops, placement,
    errors) rather than at what training computes: they differ only in what
    they pass here.

    Args:
      num_cpu_towers: the towers' devices are that many virtual CPUs, unless
        `options` name the devices (devices=None leaves the choice to towerlib).
      inputs: what the towers read; by default image_batch(batch_size) as constants.
      optimizer_kind: "sgd" or "momentum", as make_optimizer takes it.
      options: the other arguments of towerlib.build_train_graph.
    """
    if num_cpu_towers is not None:
        options.setdefault("devices", cpu_devices(num_cpu_towers))
    if inputs is None:
        inputs = tuple(tf.constant(x) for x in image_batch(batch_size))
    return towerlib.build_train_graph(
        tower_fn, inputs, make_optimizer(optimizer_kind), **options)


def run_reference(model_fn, batch, optimizer_kind, steps=5):
    """Plain single-device TF 1 training on the whole batch; weights by name."""
    graph = tf.Graph()
    with graph.as_default():
        inputs = tuple(tf.constant(x) for x in batch)
        ctx = towerlib.TowerContext.single(is_training=True)
        loss = model_fn(inputs, ctx)
        total = loss + tf.add_n(tf.compat.v1.losses.get_regularization_losses() or [0.0])
        update_ops = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)
        with tf.control_dependencies(update_ops):
            train_op = make_optimizer(optimizer_kind).minimize(total)
        variables = model_variables()
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            load_values(session, variables, initial_values_for(variables))
            for _ in range(steps):
                session.run(train_op)
            return {v.op.name: session.run(v) for v in variables}


def run_towers(model_fn, batch, optimizer_kind, num_towers, steps=5,
               bn_mode="first_tower", param_device="cpu", feed=False,
               inputs_override=None, **kwargs):
    """towerlib training on `num_towers` virtual CPUs; (weights by name, graph, values).

    With feed=True the batch goes through placeholders of unknown batch size,
    exercising the dynamic split.
    """
    graph = tf.Graph()
    with graph.as_default():
        if feed:
            placeholders = tuple(
                tf.compat.v1.placeholder(tf.as_dtype(x.dtype), [None] + list(x.shape[1:]))
                for x in batch)
            inputs, feed_dict = placeholders, dict(zip(placeholders, batch))
        else:
            inputs, feed_dict = tuple(tf.constant(x) for x in batch), None
        if inputs_override is not None:
            inputs = inputs_override
        train = towerlib.build_train_graph(
            model_fn, inputs, make_optimizer(optimizer_kind),
            devices=cpu_devices(num_towers), bn_mode=bn_mode,
            update=kwargs.pop("update", towerlib.ParameterServer(device=param_device)),
            **kwargs)
        variables = model_variables()
        config = towerlib.session_config(num_towers, allow_soft_placement=False)
        with tf.compat.v1.Session(config=config) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            load_values(session, variables, initial_values_for(variables))
            for _ in range(steps):
                session.run(train.train_op, feed_dict)
            weights = {v.op.name: session.run(v) for v in variables}
            step = session.run(train.global_step)
            return weights, train, step


def max_abs_difference(left, right):
    assert sorted(left) == sorted(right), (sorted(left), sorted(right))
    return max(float(np.max(np.abs(left[k] - right[k]))) for k in left)


def event_scalars(log_dir):
    """The scalar summaries of the event files in `log_dir`: {tag: [(step, value), ...]},
    each file's in the order they were written; a later value of a step overrides
    an earlier one in dict(scalars[tag])."""
    scalars = {}
    for path in glob.glob(os.path.join(log_dir, "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars


REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def python_path(first=REPO_ROOT):
    """PYTHONPATH for a process a test starts: `first`, then this process's PYTHONPATH,
    which holds tests/process_site (TensorFlow's import without the garbage collector,
    tests/conftest.py)."""
    return os.pathsep.join(filter(None, [str(first), os.environ.get("PYTHONPATH")]))


def run_python_script(script, timeout_secs=120):
    """Runs `script` in a fresh Python process bounded by `timeout_secs`.

    For tests of runs that could hang: a hang kills the child, not the suite.
    """
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=python_path())
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, check=False, text=True,
        timeout=timeout_secs, env=env, cwd=REPO_ROOT)


def linear_classifier_tower(inputs, ctx):
    """(features [n, 4] float32, labels [n] int32) -> mean cross entropy of one dense layer."""
    del ctx
    weights = tf.compat.v1.get_variable("w", [4, 2])
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=inputs[1], logits=tf.matmul(inputs[0], weights)))


def run_time_batches(num_examples, batch_size, take=None):
    """(features, labels) from a one-shot iterator: the batch size known only at run time."""
    dataset = tf.data.Dataset.from_tensor_slices(
        (tf.zeros([num_examples, 4]), tf.zeros([num_examples], tf.int32))).batch(batch_size)
    if take is not None:
        dataset = dataset.take(take)
    return tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()

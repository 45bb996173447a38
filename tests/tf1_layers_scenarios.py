"""tf.compat.v1.layers models under towerlib, run in a fresh process.

`tf.compat.v1.layers` exists only with tf_keras installed and
TF_USE_LEGACY_KERAS=1 set before TensorFlow is imported; the test suite has
imported TensorFlow by then, so tests/batchnorm/test_tf1_batch_norm.py runs this file
with `python -m tests.tf1_layers_scenarios` and reads the one JSON line it
prints: {scenario: result}, or {"skip": reason} when tf_keras is missing.
A scenario that raises reports {"error": traceback} instead of a result.
"""

import json
import os
import sys
import traceback

os.environ["TF_USE_LEGACY_KERAS"] = "1"  # before TensorFlow is imported
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

try:
    import tf_keras  # noqa: F401
except ImportError as missing:
    print(json.dumps({"skip": f"tf_keras cannot be imported ({missing}); "
                              "pip install 'tf_keras==2.21.*'"}))
    sys.exit(0)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import towerlib  # noqa: E402
from tests import helpers  # noqa: E402
from towerlib.batchnorm.foreign import ForeignBatchNormError  # noqa: E402

MOMENTUM = 0.5  # far from 0.99, so that a few steps move the moving statistics
STEPS = 4


def tf1_model(inputs, ctx, layers_for, training=True, fused=None):
    """TF 1 code as written for one device; only `tfl = ...` differs per version.

    layers_for: ctx -> the layers module (tf.compat.v1.layers, or
    towerlib.layers.for_tower). [B, 6, 6, 2] images -> 3 classes.
    """
    tfl = layers_for(ctx)
    images, labels = inputs
    h = tfl.conv2d(images, 4, 3, use_bias=False, name="conv1")
    h = tf.nn.relu(tfl.batch_normalization(
        h, training=training, momentum=MOMENTUM, fused=fused, name="bn_conv1"))
    h = tfl.dense(tfl.flatten(h), 8, use_bias=False, name="fc1")
    h = tf.nn.relu(tfl.batch_normalization(
        h, training=training, momentum=MOMENTUM, name="bn_fc1"))
    logits = tfl.dense(h, helpers.NUM_CLASSES, name="logits")
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=labels, logits=logits))
    return {"loss": loss, "logits": logits}


def tf1_layers(ctx):
    del ctx
    return tf.compat.v1.layers


def towerlib_layers(ctx):
    return towerlib.layers.for_tower(ctx)


def model_for(layers_for, **options):
    return lambda inputs, ctx: tf1_model(inputs, ctx, layers_for, **options)


def as_lists(weights):
    return {name: np.asarray(value).tolist() for name, value in weights.items()}


def train_one_device(batches, layers_for):
    """Plain TF 1 on one device: minimize under the UPDATE_OPS idiom."""
    with tf.Graph().as_default():
        images = tf.compat.v1.placeholder(tf.float32, batches[0][0].shape)
        labels = tf.compat.v1.placeholder(tf.int32, batches[0][1].shape)
        ctx = towerlib.TowerContext.single(is_training=True)
        loss = tf1_model((images, labels), ctx, layers_for)["loss"]
        with tf.control_dependencies(
                tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)):
            train_op = helpers.make_optimizer("momentum").minimize(loss)
        variables = helpers.model_variables()
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            helpers.load_values(session, variables, helpers.initial_values_for(variables))
            for image_batch, label_batch in batches:
                session.run(train_op, {images: image_batch, labels: label_batch})
            return {v.op.name: session.run(v) for v in variables}


def train_towers(batches, model, num_towers, bn_mode):
    with tf.Graph().as_default():
        images = tf.compat.v1.placeholder(tf.float32, batches[0][0].shape)
        labels = tf.compat.v1.placeholder(tf.int32, batches[0][1].shape)
        train = towerlib.build_train_graph(
            model, (images, labels), helpers.make_optimizer("momentum"),
            devices=helpers.cpu_devices(num_towers), bn_mode=bn_mode)
        variables = helpers.model_variables()
        with tf.compat.v1.Session(config=towerlib.session_config(num_towers)) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            helpers.load_values(session, variables, helpers.initial_values_for(variables))
            for image_batch, label_batch in batches:
                session.run(train.train_op, {images: image_batch, labels: label_batch})
            return {v.op.name: session.run(v) for v in variables}


def build_error(model, bn_mode, num_towers=2):
    """The ForeignBatchNormError's text when building, or None if it builds."""
    with tf.Graph().as_default():
        batch = tuple(tf.constant(x) for x in helpers.image_batch(8))
        try:
            towerlib.build_train_graph(
                model, batch, helpers.make_optimizer("sgd"),
                devices=helpers.cpu_devices(num_towers), bn_mode=bn_mode)
        except ForeignBatchNormError as error:
            return str(error)
    return None


def detection():
    """The error text per (bn_mode, how the layer is called); None: it built."""
    training_tensor = lambda: tf.compat.v1.placeholder_with_default(True, [])  # noqa: E731
    variants = {
        "training_true": {},
        "unfused": {"fused": False},
        "training_tensor": {"training": "tensor"},
    }
    results = {}
    for bn_mode in ("sync", "all_towers", "first_tower"):
        for variant, options in variants.items():
            def model(inputs, ctx, options=options):
                options = dict(options)
                if options.get("training") == "tensor":
                    options["training"] = training_tensor()
                return tf1_model(inputs, ctx, tf1_layers, **options)
            results[f"{bn_mode}/{variant}"] = build_error(model, bn_mode)
    results["sync/one_tower"] = build_error(model_for(tf1_layers), "sync", num_towers=1)
    results["sync/towerlib"] = build_error(model_for(towerlib_layers), "sync")
    return results


def equivalence():
    """TF 1 layers on one device vs towerlib's drop-in on towers; max differences."""
    batches = helpers.image_batches(12, steps=STEPS, seed=3)
    reference = train_one_device(batches, tf1_layers)
    towerlib_one_device = train_one_device(batches, towerlib_layers)
    results = {"names_equal": sorted(reference) == sorted(towerlib_one_device),
               "one_device": per_variable_difference(reference, towerlib_one_device)}
    for num_towers in (2, 3):
        weights = train_towers(batches, model_for(towerlib_layers), num_towers, "sync")
        results[f"sync_{num_towers}"] = per_variable_difference(reference, weights)
    return results


def per_variable_difference(left, right):
    return {name: float(np.max(np.abs(left[name] - right[name]))) for name in left}


def first_tower_foreign():
    """first_tower with tf.compat.v1.layers: one step's moving statistics come
    from tower 0's shard: those of one device trained on that shard alone."""
    batch = helpers.image_batch(8, seed=5)
    shard0 = tuple(x[:4] for x in batch)
    reference = train_one_device([shard0], tf1_layers)
    weights = train_towers([batch], model_for(tf1_layers), 2, "first_tower")
    whole = train_one_device([batch], tf1_layers)
    moving = [n for n in reference if "moving" in n]
    return {
        "shard0_difference": max(float(np.max(np.abs(reference[n] - weights[n])))
                                 for n in moving),
        "whole_batch_difference": max(float(np.max(np.abs(whole[n] - weights[n])))
                                      for n in moving),
    }


def checkpoint():
    """A checkpoint of the TF 1 model restores into the drop-in; outputs agree."""
    path = os.path.join(sys.argv[1], "tf1_model.ckpt")
    batches = helpers.image_batches(8, steps=3, seed=7)
    test_arrays = helpers.image_batch(8, seed=11)
    outputs, names = {}, {}
    for version, layers_for in (("tf1", tf1_layers), ("towerlib", towerlib_layers)):
        with tf.Graph().as_default():
            train_op, feed = None, None
            test_batch = tuple(tf.constant(x) for x in test_arrays)
            if version == "tf1":  # trained a few steps, so every variable moved
                images = tf.compat.v1.placeholder(tf.float32, batches[0][0].shape)
                labels = tf.compat.v1.placeholder(tf.int32, batches[0][1].shape)
                loss = tf1_model((images, labels), None, layers_for)["loss"]
                with tf.control_dependencies(
                        tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)):
                    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
                feed = [{images: b[0], labels: b[1]} for b in batches]
            logits = {}
            with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope(),
                                             reuse=tf.compat.v1.AUTO_REUSE):
                for training in (True, False):
                    ctx = towerlib.TowerContext.single(is_training=training)
                    logits[training] = tf1_model(test_batch, ctx, layers_for,
                                                 training=training)["logits"]
            variables = helpers.model_variables()
            names[version] = sorted(v.op.name for v in variables)
            saver = tf.compat.v1.train.Saver(variables)
            with tf.compat.v1.Session() as session:
                if version == "tf1":
                    session.run(tf.compat.v1.global_variables_initializer())
                    helpers.load_values(session, variables,
                                        helpers.initial_values_for(variables))
                    for feed_dict in feed:
                        session.run(train_op, feed_dict)
                    saver.save(session, path)
                else:
                    saver.restore(session, path)
                outputs[version] = {k: session.run(v) for k, v in logits.items()}
    return {
        "names_equal": names["tf1"] == names["towerlib"],
        "names": names["towerlib"],
        "training_difference": float(np.max(np.abs(
            outputs["tf1"][True] - outputs["towerlib"][True]))),
        "inference_difference": float(np.max(np.abs(
            outputs["tf1"][False] - outputs["towerlib"][False]))),
    }


def half_precision():
    """TF 1 layers' batch norm under each half compute dtype: the error's first line."""
    messages = {}
    for precision in ("bfloat16", "float16"):
        with tf.Graph().as_default():
            batch = tuple(tf.constant(x) for x in helpers.image_batch(8))
            try:
                towerlib.build_train_graph(
                    model_for(tf1_layers), batch, helpers.make_optimizer("sgd"),
                    devices=helpers.cpu_devices(2), precision=precision)
                messages[precision] = None
            except TypeError as error:
                messages[precision] = str(error).splitlines()[0]
    return messages


SCENARIOS = {"half_precision": half_precision, "detection": detection,
             "equivalence": equivalence,
             "first_tower_foreign": first_tower_foreign, "checkpoint": checkpoint}


def main():
    results = {}
    for name, scenario in SCENARIOS.items():
        try:
            results[name] = scenario()
        except Exception:  # reported to the test, which fails with the traceback
            results[name] = {"error": traceback.format_exc()}
    print("RESULTS " + json.dumps(results))


if __name__ == "__main__":
    main()

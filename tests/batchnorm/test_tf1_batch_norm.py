"""TF 1 batch norm under towerlib: foreign layers refused, the drop-in's equivalence.

tf.compat.v1.layers needs tf_keras and TF_USE_LEGACY_KERAS=1 before TensorFlow
is imported, so those tests read the results of tests/tf1_layers_scenarios.py,
run once in a fresh process. The drop-in itself and hand-written batch norm
are tested here, in process.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import towerlib
from tests import helpers
from towerlib import layers
from towerlib.batchnorm.foreign import ForeignBatchNormError

MOMENTUM = 0.5
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory):
    """{scenario: result} from tests/tf1_layers_scenarios.py in a fresh Python."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_USE_LEGACY_KERAS="1",
               PYTHONPATH=helpers.REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    run = subprocess.run(
        [sys.executable, "-m", "tests.tf1_layers_scenarios",
         str(tmp_path_factory.mktemp("tf1_checkpoint"))],
        capture_output=True, text=True, timeout=600, env=env, cwd=helpers.REPO_ROOT,
        check=False)
    lines = [line for line in run.stdout.splitlines() if line.startswith(("RESULTS ", "{"))]
    assert run.returncode == 0 and lines, run.stdout[-3000:] + run.stderr[-3000:]
    results = json.loads(lines[-1].split(" ", 1)[1] if lines[-1].startswith("RESULTS")
                         else lines[-1])
    if "skip" in results:
        pytest.skip(results["skip"])
    return results


def scenario(scenarios, name):
    result = scenarios[name]
    assert "error" not in result, result.get("error")
    return result


# --- tf.compat.v1.layers (subprocess) ---------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("precision", ["bfloat16", "float16"])
def test_tf1_layers_batch_norm_in_half_precision_names_the_swap(scenarios, precision):
    """One line at build time, not FusedBatchNormV3's TypeError."""
    message = scenario(scenarios, "half_precision")[precision]
    assert message is not None and message.startswith("Tower 0: a fused batch norm")
    assert f"cannot compute in {precision}" in message
    assert "towerlib.layers.for_tower(ctx)" in message


@pytest.mark.slow
@pytest.mark.parametrize("bn_mode", ["sync", "all_towers"])
@pytest.mark.parametrize("variant", ["training_true", "unfused", "training_tensor"])
def test_tf1_layers_batch_norm_is_refused_with_the_layer_names(scenarios, bn_mode, variant):
    message = scenario(scenarios, "detection")[f"{bn_mode}/{variant}"]
    assert message is not None, "built without an error"
    assert f"bn_mode='{bn_mode}'" in message
    assert "'bn_conv1'" in message and "'bn_fc1'" in message
    assert "towers 0, 1" in message
    assert "towerlib.layers.for_tower(ctx)" in message
    assert "bn_mode='first_tower'" in message


@pytest.mark.slow
@pytest.mark.parametrize("case", ["first_tower/training_true", "first_tower/unfused",
                                  "first_tower/training_tensor", "sync/one_tower",
                                  "sync/towerlib"])
def test_not_refused_where_nothing_is_lost(scenarios, case):
    """first_tower is what a foreign layer does; one tower is exact; the drop-in is ours."""
    assert scenario(scenarios, "detection")[case] is None


@pytest.mark.slow
def test_first_tower_with_tf1_layers_updates_from_tower_0_only(scenarios):
    result = scenario(scenarios, "first_tower_foreign")
    assert result["shard0_difference"] < TOLERANCE
    assert result["whole_batch_difference"] > 1e-2  # it is not the whole batch's


@pytest.mark.slow
@pytest.mark.parametrize("run", ["one_device", "sync_2", "sync_3"])
def test_drop_in_on_towers_matches_tf1_layers_on_one_device(scenarios, run):
    """4 Momentum steps: every weight and moving statistic to 1e-5, but one.

    TF 1's fused kernel (a 4-D input, fused=None) updates moving_variance from
    the Bessel-corrected batch variance, n / (n - 1) times towerlib's biased
    one (n = examples x positions), so bn_conv1/moving_variance differs by
    about 1/n of the variance; the unfused bn_fc1 matches.
    """
    result = scenario(scenarios, "equivalence")
    assert result["names_equal"]
    differences = result[run]
    fused_variance = differences.pop("bn_conv1/moving_variance")
    assert max(differences.values()) < TOLERANCE, differences
    assert fused_variance < 0.05


@pytest.mark.slow
def test_tf1_layers_checkpoint_restores_into_the_drop_in(scenarios):
    result = scenario(scenarios, "checkpoint")
    assert result["names_equal"], result["names"]
    assert "bn_conv1/moving_variance" in result["names"]
    assert result["training_difference"] < TOLERANCE
    assert result["inference_difference"] < TOLERANCE


# --- the drop-in and hand-written batch norm (in process) --------------------

def drop_in_model(inputs, ctx, training=True, name="bn_conv1"):
    """helpers' conv/dense model with the drop-in batch norm."""
    tfl = layers.for_tower(ctx)
    images, labels = inputs
    h = layers.conv2d(images, 4, 3, name="conv1", use_bias=False)
    h = tf.nn.relu(tfl.batch_normalization(h, training=training, momentum=MOMENTUM,
                                           name=name))
    h = layers.dense(layers.flatten(layers.max_pool2d(h, 2, 2)), 8, name="fc1",
                     use_bias=False)
    h = tf.nn.relu(tfl.batch_normalization(h, training=training, momentum=MOMENTUM,
                                           name="bn_fc1"))
    logits = layers.dense(h, helpers.NUM_CLASSES, name="logits")
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=labels, logits=logits))


def moving(weights):
    return {k: v for k, v in weights.items() if "moving" in k}


@pytest.mark.parametrize("num_towers", [2, 3])
def test_drop_in_sync_matches_one_device_on_the_whole_batch(num_towers):
    batch = helpers.image_batch(12, seed=2)
    reference = helpers.run_reference(drop_in_model, batch, "momentum", steps=4)
    weights, _, _ = helpers.run_towers(drop_in_model, batch, "momentum", num_towers,
                                       steps=4, bn_mode="sync")
    assert helpers.max_abs_difference(reference, weights) < TOLERANCE


@pytest.mark.parametrize("bn_mode, shard, layer", [
    ("all_towers", slice(0, 12), "bn_conv1/"), ("first_tower", slice(0, 6), "bn_")])
def test_drop_in_local_modes_update_as_documented(bn_mode, shard, layer):
    """One step: all_towers' moving statistics are the whole batch's, first_tower's
    tower 0's shard's. Each tower normalizes with its own shard in both, so under
    all_towers only the first layer's input is the one device's."""
    batch = helpers.image_batch(12, seed=2)
    reference = helpers.run_reference(drop_in_model, tuple(x[shard] for x in batch),
                                      "sgd", steps=1)
    weights, _, _ = helpers.run_towers(drop_in_model, batch, "sgd", 2, steps=1,
                                       bn_mode=bn_mode)

    def statistics(values):
        return {k: v for k, v in moving(values).items() if k.startswith(layer)}

    assert len(statistics(weights)) in (2, 4)
    assert helpers.max_abs_difference(statistics(reference), statistics(weights)) < TOLERANCE


def test_training_tensor_selects_per_run_and_false_keeps_the_moving_statistics():
    batch = helpers.image_batch(8, seed=4)
    with tf.Graph().as_default():
        training = tf.compat.v1.placeholder_with_default(True, [])
        train = towerlib.build_train_graph(
            lambda inputs, ctx: drop_in_model(inputs, ctx, training=training),
            tuple(tf.constant(x) for x in batch), helpers.make_optimizer("sgd"),
            devices=helpers.cpu_devices(2), bn_mode="sync")
        moving_variables = [v for v in tf.compat.v1.global_variables() if "moving" in v.op.name]
        with tf.compat.v1.Session(config=towerlib.session_config(2)) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            before = session.run(moving_variables)
            session.run(train.train_op, {training: False})
            unchanged = session.run(moving_variables)
            session.run(train.train_op)
            after = session.run(moving_variables)
    for old, same, new in zip(before, unchanged, after):
        np.testing.assert_array_equal(old, same)
    assert any(np.max(np.abs(old - new)) > 1e-3 for old, new in zip(before, after))


def test_unnamed_layers_are_numbered_like_tf1_in_every_tower():
    def model(inputs, ctx):
        tfl = layers.for_tower(ctx)
        h = layers.flatten(inputs[0])
        h = tfl.batch_normalization(tfl.batch_normalization(h, training=True), training=True)
        return tf.reduce_mean(h)

    with tf.Graph().as_default():
        helpers.build_on_image_batch(2, tower_fn=model, bn_mode="sync")
        names = sorted(v.op.name for v in tf.compat.v1.global_variables()
                       if "batch_normalization" in v.op.name)
    assert names == sorted(f"{layer}/{variable}"
                           for layer in ("batch_normalization", "batch_normalization_1")
                           for variable in ("beta", "gamma", "moving_mean", "moving_variance"))


@pytest.mark.parametrize("argument", [{"renorm": True}, {"virtual_batch_size": 2},
                                      {"gamma_constraint": tf.identity}])
def test_unsupported_arguments_are_refused(argument):
    with tf.Graph().as_default():
        x = tf.zeros([4, 3])
        with pytest.raises(ValueError, match=list(argument)[0]):
            layers.for_tower(towerlib.TowerContext.single()).batch_normalization(
                x, training=True, name="bn", **argument)


def test_initializers_and_regularizers_are_honoured():
    with tf.Graph().as_default():
        tfl = layers.for_tower(towerlib.TowerContext.single())
        tfl.batch_normalization(tf.zeros([4, 3]), training=True, name="bn",
                                gamma_initializer=tf.compat.v1.zeros_initializer(),
                                beta_regularizer=lambda beta: tf.reduce_sum(beta) + 7.0)
        gamma = [v for v in tf.compat.v1.global_variables() if v.op.name == "bn/gamma"][0]
        regularization = tf.compat.v1.losses.get_regularization_losses()
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            np.testing.assert_array_equal(session.run(gamma), np.zeros(3))
            assert [session.run(t) for t in regularization] == [7.0]


def hand_written_fused(inputs, ctx):
    """tf.nn.fused_batch_norm with its own moving averages under other names."""
    images, labels = inputs
    h = layers.conv2d(images, 4, 3, name="conv1", use_bias=False)
    with tf.compat.v1.variable_scope("my_bn"):
        scale = tf.compat.v1.get_variable("scale", [4], initializer=tf.ones_initializer())
        offset = tf.compat.v1.get_variable("offset", [4], initializer=tf.zeros_initializer())
        population_mean = tf.compat.v1.get_variable(
            "population_mean", [4], initializer=tf.zeros_initializer(), trainable=False)
        h, mean, _ = tf.compat.v1.nn.fused_batch_norm(h, scale, offset, is_training=True)
        tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.UPDATE_OPS,
                                       population_mean.assign(0.9 * population_mean + 0.1 * mean))
    logits = layers.dense(layers.flatten(h), helpers.NUM_CLASSES, name="logits")
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=labels, logits=logits))


def hand_written_moments(inputs, ctx):
    """The other TF 1 recipe: tf.nn.moments, averages kept in variables of its own naming."""
    images, labels = inputs
    h = layers.dense(layers.flatten(images), 8, name="fc1", use_bias=False)
    with tf.compat.v1.variable_scope("moments_bn"):
        population_mean = tf.compat.v1.get_variable(
            "pop_mean", [8], initializer=tf.zeros_initializer(), trainable=False)
        mean, variance = tf.nn.moments(h, [0])
        tf.compat.v1.add_to_collection(
            tf.compat.v1.GraphKeys.UPDATE_OPS,
            tf.compat.v1.assign(population_mean, 0.9 * population_mean + 0.1 * mean))
        h = tf.nn.batch_normalization(h, mean, variance, None, None, 1e-3)
    logits = layers.dense(h, helpers.NUM_CLASSES, name="logits")
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=labels, logits=logits))


@pytest.mark.parametrize("model, layer", [(hand_written_fused, "my_bn"),
                                          (hand_written_moments, "moments_bn")])
@pytest.mark.parametrize("bn_mode", ["sync", "all_towers"])
def test_hand_written_batch_norm_is_refused(model, layer, bn_mode):
    with tf.Graph().as_default():
        with pytest.raises(ForeignBatchNormError, match=f"'{layer}"):
            helpers.build_on_image_batch(2, tower_fn=model, bn_mode=bn_mode)


@pytest.mark.parametrize("model", [hand_written_fused, hand_written_moments])
def test_hand_written_batch_norm_builds_with_first_tower(model):
    with tf.Graph().as_default():
        train = helpers.build_on_image_batch(2, tower_fn=model, bn_mode="first_tower")
        assert train.update_ops  # tower 0's own update ops, as documented


def test_replicated_lists_each_foreign_layer_once():
    """Not once per tower's copy."""
    with tf.Graph().as_default():
        with pytest.raises(ForeignBatchNormError) as raised:
            helpers.build_on_image_batch(4, tower_fn=hand_written_fused, bn_mode="all_towers",
                                         update="replicated")
    listing = str(raised.value).split(":\n  ", 1)[1].split("\nBuilt as they are")[0]
    assert listing.count("\n") == 0 and listing.startswith("'my_bn'"), listing
    assert "towers 0, 1, 2, 3" in listing

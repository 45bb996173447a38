"""ForeignBatchNormError under replicated variables names each layer and each variable once.

The layer was listed once per tower's copy; then its
evidence still named every copy ('writes replicated/tower_1/my_bn/...' for
towers 1-3). One entry per layer, each piece of evidence once, the variable
by the name tower 0's copy has (the checkpoint's).
"""

import pytest
import tensorflow as tf

from tests import helpers
from tests.batchnorm.test_tf1_batch_norm import hand_written_fused, hand_written_moments
from towerlib import layers
from towerlib.batchnorm.foreign import ForeignBatchNormError


def moving_mean_by_name(inputs, ctx):
    """A write to a variable named like batch norm's moving statistics."""
    del ctx
    images, labels = inputs
    h = layers.dense(layers.flatten(images), 8, name="fc1", use_bias=False)
    with tf.compat.v1.variable_scope("named_bn"):
        moving_mean = tf.compat.v1.get_variable(
            "moving_mean", [8], initializer=tf.zeros_initializer(), trainable=False)
        tf.compat.v1.add_to_collection(
            tf.compat.v1.GraphKeys.UPDATE_OPS,
            tf.compat.v1.assign_add(moving_mean, tf.ones([8])))
    logits = layers.dense(h, helpers.NUM_CLASSES, name="logits")
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=labels, logits=logits))


def _listing(model, bn_mode, update):
    with tf.Graph().as_default():
        with pytest.raises(ForeignBatchNormError) as raised:
            helpers.build_on_image_batch(4, tower_fn=model, bn_mode=bn_mode, update=update)
    return str(raised.value).split(":\n  ", 1)[1].split("\nBuilt as they are")[0]


@pytest.mark.parametrize("model, layer, variable", [
    (hand_written_fused, "my_bn", "my_bn/population_mean"),
    (hand_written_moments, "moments_bn", "moments_bn/pop_mean"),
    (moving_mean_by_name, "named_bn", "named_bn/moving_mean"),
])
@pytest.mark.parametrize("bn_mode", ["all_towers", "sync"])
def test_replicated_names_each_layer_and_variable_once(model, layer, variable, bn_mode):
    listing = _listing(model, bn_mode, "replicated")
    assert listing.count("\n") == 0 and listing.startswith(f"'{layer}'"), listing
    assert "replicated/" not in listing and "tower_" not in listing, listing
    assert listing.count(variable) == 1, listing
    assert listing.endswith("towers 0, 1, 2, 3)"), listing
    # What the parameter server's build says, word for word.
    assert listing == _listing(model, bn_mode, "parameter_server")

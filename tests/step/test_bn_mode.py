"""bn_mode takes towerlib.BnMode members or their strings, the same everywhere."""

import pytest
import tensorflow as tf

import towerlib
from tests import helpers
from towerlib.batchnorm.modes import BatchNormMode


def test_members_equal_and_hash_as_their_strings():
    assert [str(m) for m in towerlib.BnMode] == list(towerlib.BN_MODES)
    assert {"sync": 1}[towerlib.BnMode.sync] == 1 and towerlib.BnMode.sync == "sync"


@pytest.mark.parametrize("mode", list(towerlib.BnMode))
def test_a_member_builds_what_its_string_builds(mode):
    graphs = []
    for given in (mode, mode.value):
        with tf.Graph().as_default() as graph:
            images, labels = helpers.image_batch(6)
            train = towerlib.build_train_graph(
                helpers.conv_bn_model, (tf.constant(images), tf.constant(labels)),
                tf.compat.v1.train.GradientDescentOptimizer(0.1), num_towers=2, bn_mode=given)
            given_mode = train.contexts[0].bn_mode  # the mode object, equal to its name
            assert isinstance(given_mode, BatchNormMode)
            assert given_mode == mode.value and str(given_mode) == mode.value
            graphs.append(len(graph.as_graph_def().node))
    assert graphs[0] == graphs[1]


def test_an_unknown_mode_names_the_choices():
    with tf.Graph().as_default(), pytest.raises(ValueError, match="Unknown bn_mode 'synced'"):
        images, labels = helpers.image_batch(4)
        towerlib.build_train_graph(helpers.conv_bn_model,
                                   (tf.constant(images), tf.constant(labels)),
                                   tf.compat.v1.train.GradientDescentOptimizer(0.1),
                                   num_towers=2, bn_mode="synced")

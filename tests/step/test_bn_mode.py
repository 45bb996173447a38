"""bn_mode takes towerlib.BnMode members or their strings, the same everywhere; one type,
resolved once at the edge."""

import ast
import pathlib

import pytest
import tensorflow as tf

import towerlib
from tests import helpers
from towerlib.batchnorm import modes


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
            assert given_mode is mode
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


def test_a_mode_is_one_of_three_members_and_nothing_else_passes_for_one():
    assert [repr(m) for m in towerlib.BnMode] == ["'first_tower'", "'all_towers'", "'sync'"]
    for not_a_mode in ("", "SYNC", None, 1):
        with pytest.raises(ValueError, match="Unknown bn_mode"):
            modes.resolve_bn_mode(not_a_mode)
    with pytest.raises(TypeError):
        towerlib.BnMode()  # no bare protocol to build a nameless mode from


def test_after_the_options_nothing_in_the_build_resolves_the_mode_again():
    """The one resolver is the options' (and the public constructors at the edge: a
    TowerContext made by hand, check_bn_mode_for_cluster); the modules after it take
    the member."""
    root = pathlib.Path(towerlib.__file__).parent
    callers = sorted(str(path.relative_to(root)) for path in root.rglob("*.py")
                     if _names_resolve_bn_mode(path))
    assert callers == ["batchnorm/modes.py", "cluster/ps_step.py", "step/context.py",
                       "step/options.py"], callers


def _names_resolve_bn_mode(path):
    """Whether the module's code (not its text) names resolve_bn_mode."""
    return any(isinstance(node, ast.Name) and node.id == "resolve_bn_mode"
               or isinstance(node, ast.FunctionDef) and node.name == "resolve_bn_mode"
               for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))))

"""max_steps is the global step to stop at; an input that ends at once is named."""

import logging
import os

import pytest
import tensorflow as tf

import towerlib
from tests import helpers
from tests.fault_scripts import tiny_model


def _train(train_dir, max_steps, **build_options):
    with tf.Graph().as_default():
        train = tiny_model.build(**build_options)
        return towerlib.run_training(
            train, train_dir=str(train_dir), max_steps=max_steps,
            session_config=tiny_model.session_config(2), save_summaries_steps=None)


def _checkpoint_steps(train_dir):
    return sorted(int(name.split("-")[1].split(".")[0]) for name in os.listdir(train_dir)
                  if name.startswith("model.ckpt-") and name.endswith(".index"))


def test_max_steps_zero_trains_nothing(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="towerlib"):
        result = _train(tmp_path, 0)
    assert result.global_step == 0 and result.loss is None
    assert _checkpoint_steps(tmp_path) == [0]
    assert "Nothing to train: global step 0 is already at or past max_steps=0" in caplog.text


def test_a_run_at_or_past_max_steps_does_not_step_again(tmp_path, caplog):
    assert _train(tmp_path, 3).global_step == 3
    with caplog.at_level(logging.INFO, logger="towerlib"):
        result = _train(tmp_path, 1)
    assert result.global_step == 3 and result.loss is None
    assert max(_checkpoint_steps(tmp_path)) == 3
    assert "global step 3 is already at or past max_steps=1" in caplog.text
    assert result.nothing_to_train
    assert _train(tmp_path, 3).global_step == 3
    assert _train(tmp_path, 4).global_step == 4


def test_an_input_that_ends_before_the_first_step_is_named(tmp_path):
    with tf.Graph().as_default():
        train = towerlib.build_train_graph(
            helpers.linear_classifier_tower, helpers.run_time_batches(8, 4, take=0),
            tf.compat.v1.train.GradientDescentOptimizer(0.1), devices=["/device:CPU:0"])
        with pytest.raises(towerlib.DataError,
                           match=r"^The input ended before the first step \(global step 0, "
                                 r"max_steps=3\): check that the dataset yields"):
            towerlib.run_training(train, train_dir=str(tmp_path), max_steps=3,
                                  save_summaries_steps=None)


def test_run_training_outside_the_graphs_context(tmp_path):
    """The graph need not be the default one when run_training is called."""
    graph = tf.Graph()
    with graph.as_default():
        train = tiny_model.build()
    result = towerlib.run_training(train, train_dir=str(tmp_path), max_steps=2,
                                   session_config=tiny_model.session_config(2))
    assert result.global_step == 2


def test_a_run_finding_its_work_done_says_so_with_the_folder_and_the_fix(tmp_path, caplog):
    first = _train(tmp_path, 2)
    assert (first.global_step, first.nothing_to_train) == (2, False)
    with caplog.at_level(logging.INFO, logger="towerlib"):
        again = _train(tmp_path, 2)
    assert (again.global_step, again.loss, again.nothing_to_train) == (2, None, True)
    line = next(m for m in caplog.messages if m.startswith("Nothing to train"))
    assert f"already at or past max_steps=2 in {tmp_path} " in line
    assert "Fix: a higher max_steps to continue this run, or another train_dir" in line

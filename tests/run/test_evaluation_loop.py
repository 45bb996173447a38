"""Evaluation in the loop: the best kept, early stopping decided as defined, resumable.

The model is one weight w, trained by gradient descent (rate 0.05) towards 1 from 0,
so after t steps w = 1 - 0.9^t; the evaluation's score is -(w - 0.5)^2, which
improves until w passes 0.5 (between steps 6 and 7) and then worsens. Evaluated
every 2 steps, the best is at step 6; with patience 2 the run stops at step 10.
"""

import logging
import os

import numpy as np
import pytest
import tensorflow as tf

import towerlib

RATE, EVERY, PATIENCE = 0.05, 2, 2


def expected_run(max_steps, patience=PATIENCE, min_delta=0.0):
    """(scores by step, best step, stop step or None): the definition, in float64."""
    scores, best, best_step, since = {}, -np.inf, -1, 0
    for step in range(EVERY, max_steps + 1, EVERY):
        w = 1.0 - (1.0 - 2 * RATE) ** step
        scores[step] = -(w - 0.5) ** 2
        if scores[step] > best + min_delta:
            best, best_step, since = scores[step], step, 0
        else:
            since += 1
        if patience and since >= patience:
            return scores, best_step, step
    return scores, best_step, None


def tower(inputs, ctx):
    w = tf.compat.v1.get_variable("w", [], initializer=tf.zeros_initializer())
    return tf.reduce_mean(tf.square(w - inputs[:, 0]))


def score(inputs, ctx):
    w = tf.compat.v1.get_variable("w", [])
    return {"score": -tf.square(w - inputs[:, 0]), "w": w + 0.0 * inputs[:, 0]}


class Scores(tf.compat.v1.train.SessionRunHook):
    """Counts the training steps run in this process."""

    def __init__(self):
        self.steps = 0

    def after_run(self, run_context, run_values):
        self.steps += 1


def train(train_dir, max_steps, patience=PATIENCE, metric_fn=score, agree=None, **options):
    with tf.Graph().as_default():
        tf.compat.v1.train.get_or_create_global_step()
        train_graph = towerlib.build_train_graph(
            tower, tf.ones([4, 1]), tf.compat.v1.train.GradientDescentOptimizer(RATE),
            num_towers=2)
        batches = tf.compat.v1.data.make_initializable_iterator(
            tf.data.Dataset.from_tensor_slices(np.full([6, 1], 0.5, np.float32)).batch(6))
        evaluation = towerlib.Evaluation(
            towerlib.build_eval_graph(metric_fn, batches.get_next(), num_towers=2,
                                      reuse_variables=True),
            every_n_steps=EVERY, metric="score", initializer=batches.initializer,
            patience=patience, **options)
        if agree is not None:
            evaluation = evaluation.with_agreement(agree)
        counter = Scores()
        result = towerlib.run_training(
            train_graph, train_dir=str(train_dir), max_steps=max_steps, hooks=[counter],
            session_config=towerlib.session_config(2), evaluation=evaluation,
            save_summaries_steps=1, log_every_n_steps=1000)
    return result, counter.steps


def weight_in(checkpoint):
    return float(tf.train.load_checkpoint(checkpoint).get_tensor("w"))


def test_the_run_stops_where_the_definition_says_and_keeps_the_best(tmp_path):
    scores, best_step, stop = expected_run(100)
    assert (best_step, stop) == (6, 10)
    result, steps = train(tmp_path, 100)
    assert result.stopped_early_at == stop and result.global_step == stop and steps == stop
    assert result.checkpoint.endswith(f"model.ckpt-{stop}")
    np.testing.assert_allclose(result.evaluation["score"], scores[stop], rtol=1e-5)
    best = tf.train.latest_checkpoint(str(tmp_path / "best"))
    assert best.endswith(f"model.ckpt-{best_step}")
    np.testing.assert_allclose(weight_in(best), 1 - 0.9 ** best_step, rtol=1e-6)
    reader = tf.train.load_checkpoint(result.checkpoint)
    assert reader.get_tensor("towerlib_evaluation/best_step") == best_step
    assert reader.get_tensor("towerlib_evaluation/since_best") == PATIENCE
    np.testing.assert_allclose(reader.get_tensor("towerlib_evaluation/best"),
                               scores[best_step], rtol=1e-5)


def test_each_evaluation_is_in_tensorboard(tmp_path):
    scores, _, stop = expected_run(100)
    train(tmp_path, 100)
    written = {}
    for name in os.listdir(tmp_path):
        if name.startswith("events.out"):
            for event in tf.compat.v1.train.summary_iterator(str(tmp_path / name)):
                for value in event.summary.value:
                    if value.tag == "eval/score":
                        written[event.step] = value.simple_value
    assert sorted(written) == sorted(scores) == list(range(EVERY, stop + 1, EVERY))
    for step, value in written.items():
        np.testing.assert_allclose(value, scores[step], rtol=1e-5)


def test_a_restarted_run_keeps_its_patience_and_an_ended_one_stays_ended(tmp_path):
    """Cut at step 8 (one evaluation without improvement), resumed: stops at 10, as the
    uninterrupted run; run again: nothing trains."""
    first, steps = train(tmp_path, 8)
    assert (first.global_step, first.stopped_early_at, steps) == (8, None, 8)
    resumed, steps = train(tmp_path, 100)
    assert (resumed.global_step, resumed.stopped_early_at, steps) == (10, 10, 2)
    again, steps = train(tmp_path, 100)
    assert (again.global_step, again.stopped_early_at, steps) == (10, 10, 0)
    assert tf.train.latest_checkpoint(str(tmp_path / "best")).endswith("model.ckpt-6")


def test_min_delta_and_no_patience(tmp_path):
    _, best_step, stop = expected_run(100, min_delta=0.05)
    result, _ = train(tmp_path / "delta", 100, min_delta=0.05)
    assert (result.stopped_early_at, best_step, stop) == (8, 4, 8)  # 6 improves by < 0.05
    assert tf.train.latest_checkpoint(str(tmp_path / "delta" / "best")).endswith(
        "model.ckpt-4")
    result, steps = train(tmp_path / "never", 16, patience=None)
    assert (result.stopped_early_at, steps) == (None, 16)


@pytest.mark.parametrize("options, message", [
    (dict(every_n_steps=0), "every_n_steps=0: give an int >= 1"),
    (dict(metric="precision"), "metric='precision' is not one of the evaluation's values"),
    (dict(patience=1.5), "patience=1.5: give an int >= 1"),
    (dict(min_delta=-1.0), "min_delta=-1.0: give a finite number >= 0"),
    (dict(num_batches=3), "give exactly one of initializer"),
])
def test_wrong_options_are_one_line(options, message):
    with tf.Graph().as_default():
        batches = tf.compat.v1.data.make_initializable_iterator(
            tf.data.Dataset.from_tensor_slices(np.ones([4, 1], np.float32)).batch(4))
        towerlib.build_train_graph(tower, tf.ones([4, 1]),
                                   tf.compat.v1.train.GradientDescentOptimizer(0.1),
                                   num_towers=2)
        eval_graph = towerlib.build_eval_graph(score, batches.get_next(), num_towers=2,
                                               reuse_variables=True)
        arguments = dict(every_n_steps=2, metric="score", initializer=batches.initializer)
        arguments.update(options)
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
            towerlib.Evaluation(eval_graph, **arguments)


def test_a_non_finite_metric_is_no_improvement_and_is_never_saved(tmp_path):
    """A NaN metric stored as the best would make every later checkpoint refuse to save
    (no checkpoint holds a non-finite value): it counts as no improvement instead."""
    def nan_score(inputs, ctx):
        w = tf.compat.v1.get_variable("w", [])
        return {"score": w * 0.0 + inputs[:, 0] * np.float32("nan")}
    result, steps = train(tmp_path, 100, metric_fn=nan_score)
    assert (result.stopped_early_at, steps) == (4, 4)   # evaluations at 2 and 4: patience 2
    reader = tf.train.load_checkpoint(result.checkpoint)
    assert reader.get_tensor("towerlib_evaluation/best_step") == -1
    assert not (tmp_path / "best").exists()


def test_higher_is_better_takes_a_bool_only():
    """The string "False" is truthy: taken as True it would keep the worst loss."""
    with tf.Graph().as_default():
        batches = tf.compat.v1.data.make_initializable_iterator(
            tf.data.Dataset.from_tensor_slices(np.ones([4, 1], np.float32)).batch(4))
        towerlib.build_train_graph(tower, tf.ones([4, 1]),
                                   tf.compat.v1.train.GradientDescentOptimizer(0.1),
                                   num_towers=2)
        eval_graph = towerlib.build_eval_graph(score, batches.get_next(), num_towers=2,
                                               reuse_variables=True)
        with pytest.raises(TypeError, match="higher_is_better='False': give True"):
            towerlib.Evaluation(eval_graph, 2, "score", higher_is_better="False",
                                initializer=batches.initializer)
        assert not towerlib.Evaluation(eval_graph, 2, "score", higher_is_better=np.False_,
                                       initializer=batches.initializer).higher_is_better


def test_every_n_steps_past_max_steps_is_refused(tmp_path):
    with pytest.raises(ValueError, match="every_n_steps=2 is more than max_steps=1, so no "
                                         "evaluation would ever run"):
        train(tmp_path, 1)
    assert not (tmp_path / "checkpoint").exists()


def test_the_line_gives_the_value_the_decision_used(tmp_path, caplog):
    """Across workers each worker's own values are logged with the agreed one that
    decides (here an agreement that halves the metric, as a mean with a worker at 0)."""
    caplog.set_level(logging.INFO, logger="towerlib")
    scores, _, _ = expected_run(2)
    train(tmp_path, 2, agree=lambda metric: metric / 2.0)
    line = next(r.getMessage() for r in caplog.records
                if r.getMessage().startswith("step 2: evaluation"))
    assert line.startswith(f"step 2: evaluation (this worker) score {scores[2]:.6g}")
    assert f"; over every worker score {scores[2] / 2:.6g}, which decides" in line
    assert f"(best score {scores[2] / 2:.6g} at step 2)" in line

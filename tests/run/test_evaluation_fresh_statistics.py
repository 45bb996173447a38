"""An evaluation or export taken while batch norm's moving statistics are mostly their
initial values says so in one line (share, layers, fix), and early stopping counts an
evaluation against its patience only once they are at most 5% initial.

The model: batch norm (momentum 0.9) then one weight; the evaluation's score never
changes, so every evaluation after the first is "no improvement". 0.9^6 = 0.53 and
0.9^7 = 0.48: evaluated every 2 steps, the evaluations at steps 2, 4 and 6 read
statistics still mostly initial, those from step 8 on do not. 0.9^28 = 0.052 and
0.9^29 = 0.047: early stopping counts the evaluations from step 30 on.
"""

import logging

import numpy as np
import pytest
import tensorflow as tf

import towerlib
from towerlib.run import moving_statistics

MOMENTUM, EVERY, PATIENCE = 0.9, 2, 2


def tower(inputs, ctx):
    x = towerlib.batch_norm(inputs, ctx, name="bn", momentum=MOMENTUM)
    w = tf.compat.v1.get_variable("w", [], initializer=tf.zeros_initializer())
    return tf.reduce_mean(tf.square(w * x[:, 0] - 1.0))


def constant_score(inputs, ctx):
    x = towerlib.batch_norm(inputs, ctx, name="bn", momentum=MOMENTUM)
    return {"score": 0.0 * x[:, 0]}


def train(train_dir, max_steps, patience=PATIENCE):
    with tf.Graph().as_default():
        data = np.random.RandomState(0).normal(3.0, 2.0, [8, 1]).astype(np.float32)
        train_graph = towerlib.build_train_graph(
            tower, tf.constant(data), tf.compat.v1.train.GradientDescentOptimizer(0.05),
            num_towers=2)
        batches = tf.compat.v1.data.make_initializable_iterator(
            tf.data.Dataset.from_tensor_slices(data).batch(4))
        evaluation = towerlib.Evaluation(
            towerlib.build_eval_graph(constant_score, batches.get_next(), num_towers=2,
                                      reuse_variables=True),
            every_n_steps=EVERY, metric="score", initializer=batches.initializer,
            patience=patience)
        return towerlib.run_training(
            train_graph, train_dir=str(train_dir), max_steps=max_steps,
            session_config=towerlib.session_config(2), evaluation=evaluation,
            save_summaries_steps=None, log_every_n_steps=1000)


def fresh_lines(caplog):
    return [r.getMessage() for r in caplog.records
            if "moving statistics that are still" in r.getMessage()]


def test_evaluations_on_initial_statistics_are_said_and_not_counted(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="towerlib")
    result = train(tmp_path, 100)
    # Counted: 30 and 32 only (2 improves, being the first; 4 to 28 are not counted).
    assert result.stopped_early_at == 32
    evaluations = {int(r.getMessage().split()[1].rstrip(":")): r.getMessage()
                   for r in caplog.records if ": evaluation " in r.getMessage()}
    assert ("early stopping does not count it: the moving statistics are still 43% "
            "initial (it counts from 5%)") in evaluations[8]
    assert "still 5% initial" in evaluations[28]
    assert not any("does not count" in evaluations[step] for step in (2, 4, 6, 30, 32))
    lines = fresh_lines(caplog)
    assert len(lines) == 3, lines
    first, fourth, sixth = lines
    assert "evaluation at step 2" in first and "81% their initial values" in first
    assert "0.9^2 = 0.81" in first and "layers bn)" in first
    assert "from step 7 on" in first and "does not count" not in first
    assert "evaluation at step 4" in fourth and "66%" in fourth
    assert "Early stopping does not count this evaluation." in fourth
    assert "evaluation at step 6" in sixth and "53%" in sixth
    # The suggested momentum leaves at most 5% of the initial values at that step.
    suggested = moving_statistics.suggested_momentum(6)
    assert f"e.g. {suggested:g}" in sixth and suggested ** 6 <= 0.05


def test_without_patience_the_line_says_nothing_of_early_stopping(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="towerlib")
    result = train(tmp_path, 8, patience=None)
    assert result.stopped_early_at is None
    lines = fresh_lines(caplog)
    assert len(lines) == 3 and not any("Early stopping" in line for line in lines)


def test_layer_momenta_reads_a_training_switch(tmp_path):
    """for_tower(ctx)'s batch_normalization with a `training` tensor: the training
    branch's momentum."""
    def switched(inputs, ctx):
        training = tf.compat.v1.placeholder_with_default(True, [])
        x = towerlib.layers.for_tower(ctx).batch_normalization(
            inputs, momentum=0.95, training=training, name="switched")
        return tf.reduce_mean(tf.square(x))

    with tf.Graph().as_default():
        train_graph = towerlib.build_train_graph(
            switched, tf.ones([4, 3]), tf.compat.v1.train.GradientDescentOptimizer(0.1),
            num_towers=2)
        assert moving_statistics.layer_momenta(train_graph) == {
            "switched": pytest.approx(0.95)}


def _checkpoint(path, step, layers):
    with tf.Graph().as_default():
        variables = [tf.compat.v1.Variable(step, dtype=tf.int64, name="global_step")]
        for layer in layers:
            with tf.compat.v1.variable_scope(layer):
                variables.append(tf.compat.v1.get_variable("moving_mean", [3]))
                variables.append(tf.compat.v1.get_variable("moving_variance", [3]))
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            return saver.save(session, str(path / "model.ckpt"), global_step=step)


def test_an_export_of_a_checkpoint_on_initial_statistics_is_said(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="towerlib")
    layers = ["block1/bn", "block2/bn", "block3/bn", "head/bn"]
    checkpoint = _checkpoint(tmp_path, 56, layers)
    line = towerlib.check_moving_statistics(checkpoint, 0.99)
    assert line in fresh_lines(caplog)
    assert "export of step 56" in line and "57% their initial values" in line
    assert "layers block1/bn, block2/bn, block3/bn and 1 more" in line
    assert "from step 69 on" in line        # 0.99^68 = 0.505, 0.99^69 = 0.4998
    # At momentum 0.9, 0.9^56 = 0.3%: nothing to say.
    assert towerlib.check_moving_statistics(checkpoint, 0.9) is None
    assert towerlib.check_moving_statistics(checkpoint, {"head/bn": 0.99}).count(
        "layers head/bn)") == 1
    with pytest.raises(ValueError, match=r"momentum=1.5: give the batch-norm momentum"):
        towerlib.check_moving_statistics(checkpoint, 1.5)


def test_the_rule_is_momentum_to_the_power_of_updates():
    assert moving_statistics.initial_share(0.99, 56) == pytest.approx(0.5696, abs=1e-4)
    assert moving_statistics.steps_until_mostly_data(0.99) == 69
    assert moving_statistics.steps_until_mostly_data(0.9) == 7
    assert moving_statistics.fresh_layers({"a": 0.99, "b": 0.9}, 56) == {
        "a": pytest.approx(0.99 ** 56)}

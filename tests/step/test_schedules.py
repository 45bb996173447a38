"""towerlib.schedules: the rate in Python and as a tensor agree step by step, in global steps."""

import math

import numpy as np
import pytest
import tensorflow as tf

import towerlib
from towerlib import schedules

SCHEDULES = {
    "piecewise": schedules.LearningRate(0.4, schedules.PiecewiseConstant([10, 20], 0.1),
                                        schedules.Warmup(5)),
    "cosine": schedules.LearningRate(0.4, schedules.CosineDecay(30, end_fraction=0.01),
                                     schedules.Warmup(5, start_fraction=0.1)),
    "polynomial": schedules.LearningRate(0.4, schedules.PolynomialDecay(30, 0.0, power=2.0)),
    "constant": schedules.LearningRate(0.4),
}


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_python_and_tensor_rates_agree_at_every_step(name):
    schedule = SCHEDULES[name]
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        step = tf.compat.v1.placeholder(tf.int64, [])
        rate = schedule.tensor(step)
        for s in range(0, 40):
            # float32 against float64: a few units in the last place.
            assert session.run(rate, {step: s}) == pytest.approx(schedule.rate_at(s),
                                                                 rel=2e-6, abs=1e-8), s


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_the_global_step_variable_itself_drives_the_rate(name):
    """What the recipe passes: get_or_create_global_step(), an int64 variable."""
    schedule = SCHEDULES[name]
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        step = tf.compat.v1.train.get_or_create_global_step()
        rate = schedule.tensor(step)
        session.run(step.initializer)
        for s in (0, 3, 7, 25):
            step.load(s, session)
            assert session.run(rate) == pytest.approx(schedule.rate_at(s), rel=2e-6,
                                                      abs=1e-8), s


def test_warmup_then_piecewise_by_definition():
    schedule = SCHEDULES["piecewise"]
    # A boundary's own step still runs at the old rate, as in TensorFlow 1.
    assert [schedule.rate_at(s) for s in (0, 4, 5, 10, 11, 20, 21)] == pytest.approx(
        [0.4 / 5, 0.4, 0.4, 0.4, 0.04, 0.04, 0.004])


def test_piecewise_constant_decays_at_tensorflow_1s_steps():
    schedule = schedules.LearningRate(1.0, schedules.PiecewiseConstant([0, 10, 20], 0.5))
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        step = tf.compat.v1.placeholder(tf.int64, [])
        theirs = tf.compat.v1.train.piecewise_constant(step, [0, 10, 20],
                                                       [1.0, 0.5, 0.25, 0.125])
        ours = schedule.tensor(step)
        for s in range(0, 25):
            want, got = session.run([theirs, ours], {step: s})
            assert got == want == pytest.approx(schedule.rate_at(s)), s


def test_the_small_batch_warmup_starts_at_the_small_batchs_rate():
    """Goyal et al.: from the reference batch's rate at step 0 up to k times it."""
    base = schedules.linear_scaling(0.1, 1024, reference_batch=256)  # 0.4
    warmup = schedules.Warmup.from_small_batch(4, 1024, reference_batch=256)
    schedule = schedules.LearningRate(base, warmup=warmup)
    assert [schedule.rate_at(s) for s in range(6)] == pytest.approx(
        [0.1, 0.175, 0.25, 0.325, 0.4, 0.4])
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        step = tf.compat.v1.placeholder(tf.int64, [])
        rate = schedule.tensor(step)
        for s in range(6):
            assert session.run(rate, {step: s}) == pytest.approx(schedule.rate_at(s), rel=1e-6)


def test_cosine_runs_from_the_warmups_end_to_total_steps():
    schedule = SCHEDULES["cosine"]
    assert schedule.rate_at(0) == pytest.approx(0.4 * (0.1 + 0.9 * 1 / 5))
    assert schedule.rate_at(5) == pytest.approx(0.4)
    middle = 0.4 * (0.01 + 0.99 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert schedule.rate_at(5 + 12.5) == pytest.approx(middle)
    assert schedule.rate_at(30) == pytest.approx(0.4 * 0.01)
    assert schedule.rate_at(99) == pytest.approx(0.4 * 0.01)


def test_linear_scaling_and_epochs_count_global_batches():
    assert schedules.linear_scaling(0.1, global_batch=1024) == pytest.approx(0.4)
    assert schedules.linear_scaling(0.1, 8192, reference_batch=256) == pytest.approx(3.2)
    # 8 towers x 128 or 1 tower x 1024: the same global batch, the same steps.
    assert schedules.steps_for_epochs(90, 50000, 1024) == round(90 * 50000 / 1024)
    assert np.isclose(schedules.steps_for_epochs(0.5, 1000, 100), 5)


@pytest.mark.parametrize("make", [
    lambda: schedules.LearningRate(0.0), lambda: schedules.LearningRate(float("inf")),
    lambda: schedules.Warmup(-1), lambda: schedules.Warmup(2.5),
    lambda: schedules.PiecewiseConstant([20, 10]), lambda: schedules.CosineDecay(0),
    lambda: schedules.PolynomialDecay(10, power=0), lambda: schedules.linear_scaling(0.1, 0),
    lambda: schedules.LearningRate(0.1, decay="cosine")])
def test_bad_settings_are_one_line(make):
    with pytest.raises(ValueError) as error:
        make()
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("make, text", [
    (lambda: schedules.linear_scaling(float("inf"), 1024), "finite number > 0"),
    (lambda: schedules.linear_scaling(0.1, 1024.5), "whole numbers >= 1"),
    (lambda: schedules.steps_for_epochs(float("inf"), 1000, 100), "finite number >= 0"),
    (lambda: schedules.PiecewiseConstant("159"), "a list of whole steps"),
    (lambda: schedules.PiecewiseConstant([1.9, 2.9]), "a list of whole steps"),
    (lambda: schedules.PiecewiseConstant([10, 10]), "would decay twice"),
    (lambda: schedules.LearningRate(0.1, schedules.CosineDecay(100), schedules.Warmup(200)),
     r"CosineDecay\(total_steps=100\) ends before Warmup\(steps=200\)"),
    (lambda: schedules.LearningRate(0.1, schedules.PolynomialDecay(50), schedules.Warmup(50)),
     r"PolynomialDecay\(total_steps=50\) ends before"),
    (lambda: schedules.LearningRate(0.1, schedules.PiecewiseConstant([3, 50]),
                                    schedules.Warmup(10)), r"after steps \[3\] start inside"),
    (lambda: schedules.Warmup(10, ramp="from_start"), "first step at rate 0"),
    (lambda: schedules.Warmup.from_small_batch(10, 128, reference_batch=256),
     "global_batch >= reference_batch"),
])
def test_inputs_that_would_change_the_schedule_silently_are_refused(make, text):
    with pytest.raises(ValueError, match=text) as error:
        make()
    assert "\n" not in str(error.value)


def test_a_schedule_given_as_a_tensorflow_optimizers_rate_names_its_tensor():
    rate = schedules.LearningRate(0.1)
    with tf.Graph().as_default():
        weight = tf.compat.v1.get_variable("w", [2])
        optimizer = tf.compat.v1.train.MomentumOptimizer(rate, 0.9)
        with pytest.raises(TypeError, match=r"rate\.tensor\(global_step\)"):
            optimizer.minimize(tf.reduce_sum(weight))


def test_build_train_graph_names_a_schedule_given_as_the_rate_before_building():
    from tests import helpers
    optimizer = tf.compat.v1.train.MomentumOptimizer(schedules.LearningRate(0.1), 0.9)
    with tf.Graph().as_default():
        with pytest.raises(TypeError, match=r"MomentumOptimizer's learning rate is the "
                                            r"schedule LearningRate.*tensor\(global_step\)"):
            towerlib.build_train_graph(
                helpers.conv_bn_model, tuple(tf.constant(x) for x in helpers.image_batch(8)),
                optimizer, devices=helpers.cpu_devices(2))
        assert tf.compat.v1.global_variables() == []  # refused before any tower was built


def test_whole_number_floats_are_step_numbers():
    """30000.0 from a config file is step 30000; 1.9 is no step."""
    assert schedules.PiecewiseConstant([100.0, 150]).boundaries == (100, 150)

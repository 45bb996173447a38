"""towerlib.schedules: the rate in Python and as a tensor agree step by step, in global steps."""

import math

import numpy as np
import pytest
import tensorflow as tf

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


def test_warmup_then_piecewise_by_definition():
    schedule = SCHEDULES["piecewise"]
    assert [schedule.rate_at(s) for s in (0, 4, 5, 9, 10, 19, 20)] == pytest.approx(
        [0.4 / 5, 0.4, 0.4, 0.4, 0.04, 0.04, 0.004])


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

"""trace_steps: an unbounded iterable, an int, 0 and steps past max_steps are refused in
one line, without iterating the unbounded one."""

import itertools

import pytest
import tensorflow as tf

import towerlib
from tests.fault_scripts import tiny_model
from towerlib.checks import loop_options


def _first_line(**options):
    with pytest.raises(towerlib.ConfigError) as raised:
        towerlib.validate_config(**options)
    return str(raised.value).splitlines()[0]


def test_an_infinite_iterable_is_refused_without_iterating_it():
    line = _first_line(trace_steps=itertools.count(1))
    assert line.startswith("trace_steps: has more than 1000 steps (or is unbounded")
    assert "Fix:" in line


def test_run_training_refuses_an_infinite_iterable_before_anything(tmp_path):
    with tf.Graph().as_default():
        train = tiny_model.build()
        with pytest.raises(towerlib.ConfigError, match="trace_steps: has more than 1000"):
            towerlib.run_training(train, train_dir=str(tmp_path / "t"), max_steps=2,
                                  trace_steps=itertools.count(1))
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize("value", [5, 0])
def test_an_int_gets_one_clear_line(value):
    line = _first_line(trace_steps=value)
    assert line.startswith(f"trace_steps: is one int ({value}), not a collection of steps.")
    assert "not iterable" not in line


def test_run_training_with_an_int_names_it(tmp_path):
    with tf.Graph().as_default():
        train = tiny_model.build()
        with pytest.raises(towerlib.ConfigError, match=r"trace_steps: is one int \(5\)"):
            towerlib.run_training(train, train_dir=str(tmp_path / "t"), max_steps=2,
                                  trace_steps=5)


def test_steps_past_max_steps_are_refused():
    line = _first_line(trace_steps=[3, 50, 60], max_steps=10)
    assert line.startswith("trace_steps: steps 50, 60 are past max_steps=10")
    towerlib.validate_config(trace_steps=[3, 10], max_steps=10)


def test_the_bound_is_the_documented_one():
    towerlib.validate_config(trace_steps=range(1, loop_options.MAX_TRACE_STEPS + 1))
    assert "more than 1000" in _first_line(
        trace_steps=range(1, loop_options.MAX_TRACE_STEPS + 2))
    towerlib.validate_config(trace_steps=(s for s in [4, 5]))  # a finite generator

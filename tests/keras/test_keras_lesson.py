"""examples/keras_model.py, the lesson, learns the built-in data on 2 towers."""

import pytest

from examples import keras_model


@pytest.mark.slow
def test_the_keras_lesson_learns_the_generated_data(tmp_path):
    precision = keras_model.main(steps=60, num_towers=2, data_dir=str(tmp_path))
    assert precision > 0.5  # 10 classes: chance is 0.1

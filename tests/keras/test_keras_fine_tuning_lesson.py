"""examples/keras_fine_tuning.py, the lesson: MobileNetV2 fine-tuned in two phases on 2
towers (Replicated, sync), then exported; what moved in each phase, and the exports."""

import numpy as np
import pytest
import tensorflow as tf

from examples import keras_fine_tuning


def model_values(checkpoint):
    """{variable: value} of the model's float variables (no slots, step or input)."""
    reader = tf.compat.v1.train.NewCheckpointReader(checkpoint)
    return {name: reader.get_tensor(name)
            for name, dtype in reader.get_variable_to_dtype_map().items()
            if dtype == tf.float32 and "/Momentum" not in name and name != "global_step"}


def layers_before_and_from_the_top():
    with tf.Graph().as_default():
        names = [layer.name for layer in keras_fine_tuning.mobilenet().layers]
    first = names.index(keras_fine_tuning.TOP_FROM)
    return set(names[:first]), set(names[first:])


def layer_of(variable):
    return variable.rsplit("/", 1)[0]


@pytest.mark.slow
def test_fine_tuning_starts_from_the_base_moves_the_head_then_the_top_and_exports(tmp_path):
    out = keras_fine_tuning.main(str(tmp_path / "run"), str(tmp_path / "data"),
                                 phase_0_steps=2, phase_1_steps=3, phase_2_steps=3)
    start = model_values(str(tmp_path / "run" / "head" / "model.ckpt-0"))
    # Phase 1 starts from the saved base, bit for bit (tf_keras alone loads the file).
    base = keras_fine_tuning.mobilenet()
    base.load_weights(out["base"])
    for weight in base.weights:
        name = weight.name.split(":")[0]
        np.testing.assert_array_equal(start[name], weight.numpy(), err_msg=name)
    phase_1, phase_2 = model_values(out["phase_1"]), model_values(out["phase_2"])
    moved_1 = {n for n in start if not np.array_equal(start[n], phase_1[n])}
    # The base unchanged. (Its random weights, in inference mode, give features of about
    # 1e-12, so the classifier's kernel may not move in 3 steps; its bias does.)
    assert "predictions/bias" in moved_1 and moved_1 <= {"predictions/kernel",
                                                         "predictions/bias"}
    bottom, top = layers_before_and_from_the_top()
    moved_2 = {n for n in phase_1 if not np.array_equal(phase_1[n], phase_2[n])}
    assert moved_2 and all(layer_of(n) in top for n in moved_2), sorted(moved_2)
    assert {"Conv_1/kernel", "block_16_project/kernel", "predictions/kernel"} <= moved_2
    assert any(layer_of(n) in bottom for n in phase_2)  # the frozen bottom is there, unmoved

    served = out["served"]
    np.testing.assert_allclose(out["mean_logits"], served.mean(axis=0), rtol=1e-4, atol=1e-5)
    images_labels = keras_fine_tuning.test_batch(str(tmp_path / "data"))
    assert out["precision"] == pytest.approx(
        np.mean(served.argmax(axis=1) == images_labels[1]))
    np.testing.assert_allclose(out["plain"], served, rtol=1e-4, atol=1e-5)

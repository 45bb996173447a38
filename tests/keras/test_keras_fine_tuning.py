"""Fine-tuning in two phases with run_training: a frozen base and a new head, then the
base unfrozen, resumed from phase 1's checkpoint (the head's slots restored, the base's
created), against tf_keras doing the same on one device with one optimizer kept across
the phases. Both phases train at one rate here: Keras' SGD keeps its velocity scaled by
the rate (v = m v - lr g) and tf.compat.v1's Momentum does not (v = m v + g, w -= lr v),
so a rate changed between the phases would part them by the optimizers' own definitions,
not by anything towerlib does. examples/keras_model.py lowers the rate."""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import towerlib
from tests.keras import keras_models as km
from tests.keras import keras_reference as kr
from tests.keras.test_keras_as_keras import CROSS_ENTROPY, conv_model

PHASE_1_STEPS, PHASE_2_STEPS = 3, 2
PHASE_2_RATE = kr.LEARNING_RATE
BASE = ("conv/kernel", "conv/bias", "bn/gamma", "bn/beta", "bn/moving_mean",
        "bn/moving_variance")


def keras_two_phases(images, labels):
    tf_keras.backend.clear_session()
    model = conv_model(base_trainable=False)
    optimizer = tf_keras.optimizers.legacy.SGD(kr.LEARNING_RATE, momentum=kr.MOMENTUM)
    model.compile(optimizer=optimizer, loss=CROSS_ENTROPY)
    for _ in range(PHASE_1_STEPS):
        model.train_on_batch(images, labels)
    model.get_layer("base").trainable = True
    model.compile(optimizer=optimizer, loss=CROSS_ENTROPY)
    for _ in range(PHASE_2_STEPS):
        model.train_on_batch(images, labels)
    return [(w.name, w.numpy()) for w in model.weights]


def towerlib_phase(train_dir, images, labels, *, base_trainable, rate, max_steps,
                   restore_from=None, update=towerlib.Replicated):
    with tf.Graph().as_default():
        tower = towerlib.KerasTower(lambda: conv_model(base_trainable), CROSS_ENTROPY)
        train = towerlib.build_train_graph(
            tower, (tf.constant(images), tf.constant(labels)),
            tf.compat.v1.train.MomentumOptimizer(rate, kr.MOMENTUM), num_towers=2,
            bn_mode="sync", update=update())
        weights = tower.model().weights
        result = towerlib.run_training(train, train_dir=str(train_dir), max_steps=max_steps,
                                       restore_from=restore_from,
                                       session_config=towerlib.session_config(2))
        reader = tf.compat.v1.train.NewCheckpointReader(result.checkpoint)
        values = [reader.get_tensor(w.op.name) for w in weights]
        saved = {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}
        return result, values, saved


@pytest.mark.parametrize("update", [towerlib.ParameterServer, towerlib.Replicated])
def test_two_phases_of_fine_tuning_train_as_keras(tmp_path, update):
    images, labels = km.batch(13)
    initial = km.initial_weights()
    first, _, saved_1 = towerlib_phase(
        tmp_path / "phase1", images, labels, base_trainable=False, rate=kr.LEARNING_RATE,
        max_steps=PHASE_1_STEPS, update=update)
    for name in BASE:  # phase 1: the base as it started, bit for bit, and no slot
        np.testing.assert_array_equal(saved_1[name], initial[name], err_msg=name)
    assert "conv/kernel/Momentum" not in saved_1 and "logits/kernel/Momentum" in saved_1
    _, values_2, saved_2 = towerlib_phase(
        tmp_path / "phase2", images, labels, base_trainable=True, rate=PHASE_2_RATE,
        max_steps=PHASE_1_STEPS + PHASE_2_STEPS, restore_from=first.checkpoint,
        update=update)
    assert "conv/kernel/Momentum" in saved_2 and "bn/gamma/Momentum" in saved_2
    assert saved_2["global_step"] == PHASE_1_STEPS + PHASE_2_STEPS
    kr.assert_weights_close(values_2, keras_two_phases(images, labels), atol=1e-5,
                            what="after phase 2")
    assert np.abs(saved_2["conv/kernel"] - initial["conv/kernel"]).max() > 1e-4


def test_a_checkpoint_missing_more_than_new_slots_is_still_refused(tmp_path):
    images, labels = km.batch(8)
    first, _, _ = towerlib_phase(tmp_path / "phase1", images, labels, base_trainable=False,
                                 rate=0.05, max_steps=1)
    with tf.Graph().as_default():  # another model: a dense layer of its own
        tower = towerlib.KerasTower(lambda: tf_keras.Sequential([
            tf_keras.layers.Flatten(), tf_keras.layers.Dense(km.CLASSES, name="other")]),
            km.sparse_cross_entropy)
        train = towerlib.build_train_graph(
            tower, (tf.constant(images), tf.constant(labels)),
            tf.compat.v1.train.MomentumOptimizer(0.01, 0.9), num_towers=2)
        with pytest.raises(towerlib.CheckpointError, match="does not fit this graph"):
            towerlib.run_training(train, train_dir=str(tmp_path / "other"), max_steps=2,
                                  restore_from=first.checkpoint,
                                  session_config=towerlib.session_config(2))


def test_new_moving_averages_start_from_the_restored_weights(tmp_path):
    """With ema_decay, phase 2's averages of the newly trained weights are missing from
    phase 1's checkpoint: they start from the restored weights (as
    ExponentialMovingAverage starts one), not from phase 2's fresh initial values."""
    images, labels = km.batch(8)

    def phase(train_dir, make_model, max_steps, restore_from=None):
        with tf.Graph().as_default():
            tower = towerlib.KerasTower(make_model, CROSS_ENTROPY)
            train = towerlib.build_train_graph(
                tower, (tf.constant(images), tf.constant(labels)),
                tf.compat.v1.train.MomentumOptimizer(0.05, 0.9), num_towers=2,
                ema_decay=0.9)
            result = towerlib.run_training(train, train_dir=str(train_dir),
                                           max_steps=max_steps, restore_from=restore_from,
                                           session_config=towerlib.session_config(2))
            return tf.compat.v1.train.NewCheckpointReader(result.checkpoint)

    first = phase(tmp_path / "head", lambda: conv_model(base_trainable=False), 2)
    def unfrozen_with_other_initial_values():
        return conv_model(base_trainable=True, seed=99)

    head_checkpoint = str(tmp_path / "head" / "model.ckpt-2")
    second = phase(tmp_path / "top", unfrozen_with_other_initial_values, 2,
                   restore_from=head_checkpoint)  # no step: the state as restored
    np.testing.assert_array_equal(second.get_tensor("conv/kernel/ExponentialMovingAverage"),
                                  first.get_tensor("conv/kernel"))
    assert np.abs(first.get_tensor("conv/kernel")
                  - km.initial_weights(seed=99)["conv/kernel"]).max() > 0.1

"""What towerlib.internals.tf_keras relies on in tf_keras: fails loudly if a release moves it."""

import inspect
import sys
import threading

import tensorflow as tf
import tf_keras

from towerlib.internals import tf_keras as keras_internals


def test_batch_norm_layers_inherit_call_from_the_base_with_its_signature():
    base = keras_internals.batch_norm_base()
    assert "call" in base.__dict__
    parameters = list(inspect.signature(base.__dict__["call"]).parameters)
    assert parameters == ["self", "inputs", "training", "mask"]
    for layer in (tf_keras.layers.BatchNormalization,
                  tf_keras.layers.experimental.SyncBatchNormalization):
        assert issubclass(layer, base) and "call" not in layer.__dict__


def test_routing_is_per_thread_and_undone_on_exit():
    base = keras_internals.batch_norm_base()
    original = base.__dict__["call"]
    seen = []
    with tf.Graph().as_default():
        layer = tf_keras.layers.BatchNormalization()
        x = tf.ones([2, 3])
        layer.build(x.shape)
        other = []
        with keras_internals.routed_batch_norm_calls(lambda *args: seen.append(args) or x):
            assert layer(x, training=True) is not None
            thread = threading.Thread(target=lambda: other.append(layer(x, training=False)))
            thread.start()
            thread.join()
            with keras_internals.routed_batch_norm_calls(None):
                layer(x, training=False)  # tf_keras' own call
    assert len(seen) == 1 and other and other[0].op.type != "Const"
    assert base.__dict__["call"] is original


def test_name_counters_restore_layer_numbering_and_clone_keeps_names():
    with tf.Graph().as_default():
        counters = keras_internals.name_counters()
        first = tf_keras.layers.Dense(2).name
        keras_internals.restore_name_counters(counters)
        assert tf_keras.layers.Dense(2).name == first
        model = tf_keras.Sequential([tf_keras.layers.Dense(2, name="d", input_shape=(3,))])
        assert [layer.name for layer in keras_internals.clone_model(model).layers] == ["d"]


def test_the_learning_phase_placeholder_is_recognized():
    with tf.Graph().as_default():
        assert keras_internals.is_learning_phase(tf_keras.backend.learning_phase())
        assert not keras_internals.is_learning_phase(tf.constant(True))


def test_tf1_layers_batch_norm_is_recognized_by_its_module():
    """tf.compat.v1.layers.BatchNormalization lives in tf_keras.src.legacy_tf_layers."""
    from tf_keras.src.legacy_tf_layers import normalization
    assert keras_internals.is_tf1_layer(normalization.BatchNormalization())
    assert not keras_internals.is_tf1_layer(tf_keras.layers.BatchNormalization())


def test_the_global_policy_is_read_from_tf_keras_and_is_none_before_it_is_imported(
        monkeypatch):
    # A model function imports tf_keras only when it runs, after the build read the
    # policy: with tf_keras not yet imported nobody can have set one.
    assert keras_internals.global_policy_name() == "float32"
    with keras_internals.global_policy("mixed_bfloat16"):
        assert keras_internals.global_policy_name() == "mixed_bfloat16"
    monkeypatch.delitem(sys.modules, "tf_keras")
    assert keras_internals.global_policy_name() is None

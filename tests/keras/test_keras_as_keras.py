"""A Keras model under KerasTower trains as tf_keras trains it on one device, on the whole
global batch: frozen layers, the layers' own moving statistics, integer inputs, several
inputs and outputs with loss weights, and the refusals of what Keras would not mean."""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import towerlib
from tests.keras import keras_models as km
from tests.keras import keras_reference as kr

UPDATES = {"ps": towerlib.ParameterServer, "replicated": towerlib.Replicated}
CROSS_ENTROPY = tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def conv_model(base_trainable=True, seed=7):
    """base (conv -> BatchNormalization -> ReLU, a model of its own) -> pool -> Dense."""
    const = tf_keras.initializers.Constant
    w = km.initial_weights(seed)
    inputs = tf_keras.Input((8, 8, 3))
    h = tf_keras.layers.Conv2D(km.CHANNELS, 3, name="conv",
                               kernel_initializer=const(w["conv/kernel"]),
                               bias_initializer=const(w["conv/bias"]))(inputs)
    h = tf_keras.layers.BatchNormalization(name="bn", momentum=0.9,
                                           gamma_initializer=const(w["bn/gamma"]),
                                           beta_initializer=const(w["bn/beta"]))(h)
    base = tf_keras.Model(inputs, tf_keras.layers.ReLU()(h), name="base")
    base.trainable = base_trainable
    images = tf_keras.Input((8, 8, 3))
    pooled = tf_keras.layers.GlobalAveragePooling2D()(base(images))
    logits = tf_keras.layers.Dense(km.CLASSES, name="logits",
                                   kernel_initializer=const(w["logits/kernel"]))(pooled)
    return tf_keras.Model(images, logits)


def frozen_conv_model():
    return conv_model(base_trainable=False)


@pytest.mark.parametrize("update,num_towers,bn_mode", [
    ("ps", 2, "sync"), ("replicated", 2, "first_tower"), ("replicated", 4, "all_towers"),
    ("ps", 4, "first_tower")])
def test_a_frozen_base_gets_no_update_no_slot_and_runs_in_inference(update, num_towers,
                                                                    bn_mode):
    """The frozen conv and batch norm stay bit-identical to their initial values, have no
    Momentum slot, and the head trains as tf_keras trains it (a frozen batch norm
    normalizes with its moving statistics, in every bn_mode)."""
    images, labels = km.batch(13)
    want = kr.keras_one_device(frozen_conv_model, images, labels, loss=CROSS_ENTROPY,
                               steps=3)
    got, variables = kr.towerlib_steps(
        towerlib.KerasTower(frozen_conv_model, CROSS_ENTROPY), images, labels,
        num_towers=num_towers, bn_mode=bn_mode, update=UPDATES[update], steps=3)
    kr.assert_weights_close(got, want, atol=1e-5, what=f"{update} {bn_mode}")
    initial = km.initial_weights()
    for name in ("conv/kernel", "conv/bias", "bn/gamma", "bn/beta", "bn/moving_mean",
                 "bn/moving_variance"):
        np.testing.assert_array_equal(variables[name], initial[name], err_msg=name)
    slots = sorted(n for n in variables if n.endswith("/Momentum"))
    assert slots == ["logits/bias/Momentum", "logits/kernel/Momentum"]
    assert np.abs(variables["logits/kernel"] - initial["logits/kernel"]).max() > 1e-3


def test_an_explicit_var_list_still_wins_over_frozen_flags():
    images, labels = km.batch(8)
    with tf.Graph().as_default():
        tower = towerlib.KerasTower(frozen_conv_model, CROSS_ENTROPY)
        tower.model()
        variables = {v.op.name: v for v in tf.compat.v1.global_variables()}
        train = towerlib.build_train_graph(
            tower, (tf.constant(images), tf.constant(labels)),
            tf.compat.v1.train.GradientDescentOptimizer(0.1), num_towers=2,
            var_list=[variables["conv/kernel"]])
        with tf.compat.v1.Session(config=towerlib.session_config(2)) as session:
            train.initialize(session)
            before = session.run(variables)
            session.run(train.train_op)
            after = session.run(variables)
    assert np.abs(after["conv/kernel"] - before["conv/kernel"]).max() > 1e-4
    np.testing.assert_array_equal(after["logits/kernel"], before["logits/kernel"])


@pytest.mark.parametrize("update", sorted(UPDATES))
@pytest.mark.parametrize("num_towers", [2, 4])
def test_sync_moving_statistics_are_keras_own_on_an_uneven_batch(update, num_towers):
    """The fused layer's moving variance takes the Bessel-corrected variance of the global
    batch (13 examples x 36 positions), as tf_keras' fused kernel does."""
    images, labels = km.batch(13)
    want = kr.keras_one_device(conv_model, images, labels, loss=CROSS_ENTROPY, steps=3)
    got, _ = kr.towerlib_steps(towerlib.KerasTower(conv_model, CROSS_ENTROPY), images,
                               labels, num_towers=num_towers, bn_mode="sync",
                               update=UPDATES[update], steps=3)
    kr.assert_weights_close(got, want, atol=1e-5, what=f"{update} x{num_towers}")


@pytest.mark.parametrize("bn_mode", ["all_towers", "first_tower"])
def test_moving_statistics_are_keras_own_on_the_batch_the_mode_stands_for(bn_mode):
    """all_towers: the pooled global batch; first_tower: tower 0's shard (7 of 13)."""
    images, labels = km.batch(13)
    shown = slice(None) if bn_mode == "all_towers" else slice(0, 7)
    want = kr.keras_one_device(conv_model, images[shown], labels[shown],
                               loss=CROSS_ENTROPY, steps=1)
    got, _ = kr.towerlib_steps(towerlib.KerasTower(conv_model, CROSS_ENTROPY), images,
                               labels, num_towers=2, bn_mode=bn_mode, steps=1)
    names = [name for name, _ in want]
    for name in ("bn/moving_mean:0", "bn/moving_variance:0"):
        index = names.index(name)
        np.testing.assert_allclose(got[index], want[index][1], atol=1e-6, err_msg=name)


def dense_bn_model():
    """A batch norm on [n, features] (not fused in tf_keras: the biased variance)."""
    inputs = tf_keras.Input((5,))
    h = tf_keras.layers.Dense(4, name="hidden",
                              kernel_initializer=tf_keras.initializers.Constant(
                                  np.linspace(-1, 1, 20).reshape(5, 4)))(inputs)
    h = tf_keras.layers.BatchNormalization(name="bn", momentum=0.8)(h)
    return tf_keras.Model(inputs, tf_keras.layers.Dense(3, name="logits",
                                                        kernel_initializer="ones")(h))


def test_a_batch_norm_keras_does_not_fuse_keeps_the_biased_variance():
    rng = np.random.RandomState(3)
    features = rng.randn(11, 5).astype(np.float32) * 2 + 1
    labels = rng.randint(0, 3, 11).astype(np.int32)
    want = kr.keras_one_device(dense_bn_model, features, labels, loss=CROSS_ENTROPY, steps=3)
    got, _ = kr.towerlib_steps(towerlib.KerasTower(dense_bn_model, CROSS_ENTROPY), features,
                               labels, num_towers=2, update=towerlib.Replicated, steps=3)
    kr.assert_weights_close(got, want, atol=1e-5)


def embedding_model():
    """Token ids (an int32 Input) -> Embedding -> mean -> Dense."""
    tokens = tf_keras.Input((6,), dtype="int32")
    h = tf_keras.layers.Embedding(20, 4, name="embedding",
                                  embeddings_initializer=tf_keras.initializers.RandomNormal(
                                      seed=1))(tokens)
    h = tf_keras.layers.GlobalAveragePooling1D()(h)
    return tf_keras.Model(tokens, tf_keras.layers.Dense(
        3, name="logits", kernel_initializer=tf_keras.initializers.GlorotUniform(seed=2))(h))


@pytest.mark.parametrize("update", sorted(UPDATES))
def test_integer_inputs_train_as_keras(update):
    rng = np.random.RandomState(4)
    tokens = rng.randint(0, 20, (10, 6)).astype(np.int32)
    labels = rng.randint(0, 3, 10).astype(np.int32)
    want = kr.keras_one_device(embedding_model, tokens, labels, loss=CROSS_ENTROPY, steps=3)
    got, _ = kr.towerlib_steps(towerlib.KerasTower(embedding_model, CROSS_ENTROPY), tokens,
                               labels, num_towers=2, update=UPDATES[update], steps=3)
    kr.assert_weights_close(got, want, atol=1e-5)


def two_headed_model():
    """{'image', 'extra'} in, {'digit': [n, 5] logits, 'size': [n, 1]} out."""
    init = tf_keras.initializers.GlorotUniform
    image = tf_keras.Input((8, 8, 3), name="image")
    extra = tf_keras.Input((2,), name="extra")
    h = tf_keras.layers.Conv2D(4, 3, name="conv", kernel_initializer=init(seed=5))(image)
    h = tf_keras.layers.BatchNormalization(name="bn")(h)
    h = tf_keras.layers.Concatenate()([tf_keras.layers.GlobalAveragePooling2D()(h), extra])
    digit = tf_keras.layers.Dense(5, name="digit", kernel_initializer=init(seed=6))(h)
    size = tf_keras.layers.Dense(1, name="size", kernel_initializer=init(seed=7))(h)
    return tf_keras.Model({"image": image, "extra": extra}, {"digit": digit, "size": size})


def two_headed_batch(n=12):
    images, digits = km.batch(n)
    rng = np.random.RandomState(8)
    features = {"image": images, "extra": rng.randn(n, 2).astype(np.float32)}
    labels = {"digit": digits, "size": rng.randn(n, 1).astype(np.float32)}
    return features, labels


@pytest.mark.parametrize("update", sorted(UPDATES))
def test_several_inputs_and_outputs_with_loss_weights_train_as_compile_weights_them(update):
    features, labels = two_headed_batch()
    losses = {"digit": CROSS_ENTROPY, "size": "mse"}
    weights = {"digit": 1.0, "size": 0.25}
    want = kr.keras_one_device(two_headed_model, features, labels, loss=losses,
                               loss_weights=weights, steps=3)
    tower = towerlib.KerasTower(two_headed_model, losses, loss_weights=weights)
    got, _ = kr.towerlib_steps(tower, features, labels, num_towers=2,
                               update=UPDATES[update], steps=3)
    kr.assert_weights_close(got, want, atol=1e-5)


def test_metrics_per_output_in_the_evaluation():
    features, labels = two_headed_batch(9)

    def abs_error(label, output):
        return {"abs_error": tf.reduce_sum(tf.abs(label - output), axis=1)}

    with tf.Graph().as_default():
        tower = towerlib.KerasTower(two_headed_model, {"digit": CROSS_ENTROPY, "size": "mse"})
        batch = (tf.nest.map_structure(tf.constant, features),
                 tf.nest.map_structure(tf.constant, labels))
        default = towerlib.build_eval_graph(tower, batch, num_towers=2)
        per_output = towerlib.build_eval_graph(
            towerlib.KerasTower(tower.model(), None, metrics={"size": abs_error}), batch,
            num_towers=2, reuse_variables=True)
        outputs = tower.model()(batch[0], training=False)
        with tf.compat.v1.Session(config=towerlib.session_config(2)) as session:
            session.run([tf.compat.v1.global_variables_initializer(),
                         tf.compat.v1.local_variables_initializer()])
            session.run([default.update_op, per_output.update_op])
            got = session.run({"correct": default.values["digit_correct"],
                               "abs_error": per_output.values["size_abs_error"]})
            values = session.run(outputs)
    want_correct = np.mean(np.argmax(values["digit"], axis=1) == labels["digit"])
    np.testing.assert_allclose(got["correct"], want_correct, rtol=1e-6)
    np.testing.assert_allclose(got["abs_error"],
                               np.mean(np.abs(labels["size"] - values["size"])), rtol=1e-5)


def test_a_loss_of_the_wrong_shape_is_refused_in_one_line():
    images, labels = km.batch(8)
    with tf.Graph().as_default():
        tower = towerlib.KerasTower(conv_model, lambda y, p: tf.square(p) * 0 + 1.0)
        with pytest.raises(ValueError, match=r"returned shape \(None, 5\)|returned shape "
                           r"\(4, 5\).*scalar mean or one value per example"):
            towerlib.build_train_graph(tower, (tf.constant(images), tf.constant(labels)),
                                       tf.compat.v1.train.GradientDescentOptimizer(0.1),
                                       num_towers=2)


def test_labels_that_miss_an_output_are_named():
    features, labels = two_headed_batch()
    with tf.Graph().as_default():
        tower = towerlib.KerasTower(two_headed_model, {"digit": CROSS_ENTROPY})
        batch = (tf.nest.map_structure(tf.constant, features),
                 {"digit": tf.constant(labels["digit"])})
        with pytest.raises(ValueError, match=r"no entry for the model's outputs \['size'\]"):
            towerlib.build_train_graph(tower, batch,
                                       tf.compat.v1.train.GradientDescentOptimizer(0.1),
                                       num_towers=2)


@pytest.mark.parametrize("bn_mode", ["sync", "all_towers"])
def test_channels_first_moving_statistics_are_keras_own(bn_mode):
    """axis=1 on [N, C, H, W]: the fused layer's statistics, after one step (all_towers
    normalizes per shard, so later steps part from one device by definition)."""
    from tests.keras.test_keras_weights_and_axes import channels_first_model
    rng = np.random.RandomState(2)
    x = (rng.randn(7, 3, 4, 4) * 2 + 1).astype(np.float32)
    y = rng.randint(0, 2, 7).astype(np.int32)
    steps = 3 if bn_mode == "sync" else 1
    want = kr.keras_one_device(channels_first_model, x, y, loss=CROSS_ENTROPY, steps=steps)
    got, _ = kr.towerlib_steps(towerlib.KerasTower(channels_first_model, CROSS_ENTROPY), x, y,
                               num_towers=2, bn_mode=bn_mode, steps=steps)
    if bn_mode == "sync":
        kr.assert_weights_close(got, want, atol=1e-5)
    names = [name for name, _ in want]
    index = names.index("bn/moving_variance:0")
    np.testing.assert_allclose(got[index], want[index][1], atol=1e-5)


@pytest.mark.parametrize("update", sorted(UPDATES))
def test_accumulated_micro_batches_pool_to_keras_own_statistics(update):
    """k = 2 under all_towers: the moving statistics pool every micro-batch of every tower,
    so the first step's are tf_keras' on the whole global batch (Bessel with its count)."""
    images, labels = km.batch(12)
    want = kr.keras_one_device(conv_model, images, labels, loss=CROSS_ENTROPY, steps=1)
    with tf.Graph().as_default():
        tower = towerlib.KerasTower(conv_model, CROSS_ENTROPY)
        train = towerlib.build_train_graph(
            tower, (tf.constant(images), tf.constant(labels)),
            tf.compat.v1.train.MomentumOptimizer(kr.LEARNING_RATE, kr.MOMENTUM),
            num_towers=2, bn_mode="all_towers", update=UPDATES[update](),
            accumulation_steps=2)
        weights = tower.model().weights
        with tf.compat.v1.Session(config=towerlib.session_config(2)) as session:
            train.initialize(session)
            session.run(train.train_op)
            got = session.run(weights)
    names = [name for name, _ in want]
    for name in ("bn/moving_mean:0", "bn/moving_variance:0"):
        index = names.index(name)
        np.testing.assert_allclose(got[index], want[index][1], atol=1e-6, err_msg=name)


@pytest.mark.parametrize("options", [dict(accumulation_steps=2), dict(precision="bfloat16"),
                                     dict(accumulation_steps=2, update=towerlib.Replicated())],
                         ids=["accumulation", "bfloat16", "accumulation-replicated"])
def test_frozen_stays_frozen_with_accumulation_and_half_precision(options):
    images, labels = km.batch(12)
    with tf.Graph().as_default():
        tower = towerlib.KerasTower(frozen_conv_model, CROSS_ENTROPY)
        train = towerlib.build_train_graph(
            tower, (tf.constant(images), tf.constant(labels)),
            tf.compat.v1.train.MomentumOptimizer(0.05, 0.9), num_towers=2, bn_mode="sync",
            **options)
        variables = {v.op.name: v for v in tf.compat.v1.global_variables()}
        with tf.compat.v1.Session(config=towerlib.session_config(2)) as session:
            train.initialize(session)
            for _ in range(2):
                session.run(train.train_op)
            values = session.run(variables)
    initial = km.initial_weights()
    for name in ("conv/kernel", "conv/bias", "bn/gamma", "bn/beta", "bn/moving_mean",
                 "bn/moving_variance"):
        np.testing.assert_array_equal(values[name], initial[name], err_msg=name)
    assert not any(n.startswith(("conv/", "bn/")) and n.endswith("/Momentum") for n in values)
    assert np.abs(values["logits/kernel"] - initial["logits/kernel"]).max() > 1e-4


def sequential_model():
    return tf_keras.Sequential([tf_keras.layers.Flatten(input_shape=(8, 8, 3)),
                                tf_keras.layers.Dense(km.CLASSES, name="logits")])


class Subclassed(tf_keras.Model):
    def __init__(self):
        super().__init__()
        self.flatten = tf_keras.layers.Flatten()
        self.logits = tf_keras.layers.Dense(km.CLASSES)

    def call(self, inputs):
        return self.logits(self.flatten(inputs))


@pytest.mark.parametrize("kind", ["object", "function"])
def test_a_model_object_or_function_exports_what_it_trained(kind, tmp_path):
    """A model object trained in one graph exports from another (a clone of its
    structure), as a model function does; the SavedModel predicts what the weights do."""
    images, labels = km.batch(8)
    with tf.Graph().as_default():
        tower = towerlib.KerasTower(sequential_model() if kind == "object"
                                    else sequential_model, CROSS_ENTROPY)
        train = towerlib.build_train_graph(
            tower, (tf.constant(images), tf.constant(labels)),
            tf.compat.v1.train.GradientDescentOptimizer(0.5), num_towers=2,
            update=towerlib.Replicated())
        result = towerlib.run_training(train, train_dir=str(tmp_path / "run"), max_steps=2,
                                       session_config=towerlib.session_config(2))
        kernel = tf.compat.v1.train.NewCheckpointReader(result.checkpoint).get_tensor(
            "logits/kernel")
    export_dir = tower.export_saved_model(result.checkpoint, str(tmp_path / "export"))
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        meta = tf.compat.v1.saved_model.loader.load(session, ["serve"], export_dir)
        signature = meta.signature_def["serving_default"]
        (given,), (output,) = signature.inputs.values(), signature.outputs.values()
        served = session.run(output.name, {given.name: images})
    bias = tf.compat.v1.train.NewCheckpointReader(result.checkpoint).get_tensor("logits/bias")
    np.testing.assert_allclose(served, images.reshape(8, -1) @ kernel + bias, rtol=1e-4,
                               atol=1e-4)
    with pytest.raises(FileExistsError, match="does not write over it"):
        tower.export_saved_model(result.checkpoint, export_dir)


def test_a_subclassed_model_that_was_never_built_is_refused_for_export(tmp_path):
    with tf.Graph().as_default(), pytest.raises(towerlib.KerasTowerError,
                                                match="has no weights until it is called"):
        towerlib.KerasTower(Subclassed, CROSS_ENTROPY).inference_model()

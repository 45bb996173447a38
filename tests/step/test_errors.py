"""Bad input is refused early, with a message naming the problem and the fix."""

import functools

import numpy as np
import pytest
import tensorflow as tf

import towerlib
from tests import helpers

# The conv+dense model on 2 CPU towers, plain SGD; a test passes what it gets wrong.
build = functools.partial(
    helpers.build_on_image_batch, num_cpu_towers=2, tower_fn=helpers.conv_dense_model)


@pytest.fixture(autouse=True)
def fresh_graph():
    with tf.Graph().as_default():
        yield


@pytest.mark.parametrize("num_towers", [0, -2])
def test_zero_or_negative_tower_count(num_towers):
    with pytest.raises(ValueError, match="num_towers must be at least 1"):
        build(num_towers=num_towers, devices=None)


def test_non_integer_tower_count():
    with pytest.raises(TypeError, match="num_towers must be a positive int"):
        build(num_towers=2.0, devices=None)


def test_more_gpu_towers_than_gpus():
    gpus = len(tf.config.list_physical_devices("GPU"))
    too_many = (f"num_towers is {gpus + 1} but this machine has {gpus} GPU" if gpus else
                "device_type is 'gpu' but TensorFlow sees no GPU on this machine")
    with pytest.raises(ValueError, match=too_many):
        build(num_towers=gpus + 1, devices=None, device_type="gpu")


def test_tower_count_disagrees_with_devices():
    with pytest.raises(ValueError, match="num_towers=3 but 2 devices"):
        build(num_towers=3, devices=helpers.cpu_devices(2))


def test_tower_function_returns_non_scalar():
    def per_example_loss(inputs, ctx):
        images, _ = inputs
        return tf.reduce_sum(images, axis=[1, 2, 3])

    with pytest.raises(ValueError, match=r"loss .* has shape \(4,\), not a scalar.*"
                                         r"tf\.reduce_mean"):
        build(tower_fn=per_example_loss)


@pytest.mark.parametrize("bad_loss", [None, 1.5, np.float32(2.0)])
def test_tower_function_returns_non_tensor(bad_loss):
    with pytest.raises(TypeError, match="not a tf.Tensor. It must return the tower's loss"):
        build(tower_fn=lambda inputs, ctx: bad_loss)


def test_tower_function_returns_integer_tensor():
    with pytest.raises(TypeError, match="has dtype int32; a loss must be a float"):
        build(tower_fn=lambda inputs, ctx: tf.constant(1))


def test_dict_result_without_loss():
    with pytest.raises(ValueError, match="without a 'loss' entry"):
        build(tower_fn=lambda inputs, ctx: {"logits": inputs[0]})


def test_model_class_instead_of_instance():
    class Net(towerlib.TowerModel):
        def build(self, inputs, ctx):
            return helpers.conv_dense_model(inputs, ctx)

    with pytest.raises(TypeError, match=r"pass Net\(\), not Net"):
        build(tower_fn=Net)
    build(tower_fn=Net())  # the instance is fine


def test_global_batch_smaller_than_tower_count():
    inputs = tuple(tf.constant(x) for x in helpers.image_batch(3))
    with pytest.raises(ValueError, match="global batch has 3 examples but there are 4 "
                                         "towers"):
        build(inputs=inputs, devices=helpers.cpu_devices(4))


def test_global_batch_smaller_than_tower_count_at_run_time():
    images = tf.compat.v1.placeholder(tf.float32, [None, 6, 6, 2])
    labels = tf.compat.v1.placeholder(tf.int32, [None])
    train = build(inputs=(images, labels), devices=helpers.cpu_devices(4))
    small = helpers.image_batch(3)
    with tf.compat.v1.Session(config=towerlib.session_config(4)) as session:
        session.run(tf.compat.v1.global_variables_initializer())
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match="global batch is smaller than the tower count"):
            session.run(train.train_op, {images: small[0], labels: small[1]})


def test_inputs_with_different_batch_dimensions():
    images, labels = helpers.image_batch(8)
    inputs = (tf.constant(images), tf.constant(labels[:6]))
    with pytest.raises(ValueError, match="disagree on the batch .* dimension"):
        build(inputs=inputs)


def test_inputs_with_different_batch_dimensions_at_run_time():
    images = tf.compat.v1.placeholder(tf.float32, [None, 6, 6, 2])
    labels = tf.compat.v1.placeholder(tf.int32, [None])
    train = build(inputs=(images, labels))
    batch = helpers.image_batch(8)
    with tf.compat.v1.Session(config=towerlib.session_config(2)) as session:
        session.run(tf.compat.v1.global_variables_initializer())
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match="different batch dimension"):
            session.run(train.train_op, {images: batch[0], labels: batch[1][:6]})


def test_later_tower_creating_a_variable_with_get_variable():
    def sneaky(inputs, ctx):
        if ctx.index == 1:
            tf.compat.v1.get_variable("tower_one_only", [2])
        return helpers.conv_dense_model(inputs, ctx)

    with pytest.raises(ValueError, match="Tower 1 tried to create a variable .*"
                                         "tower_one_only"):
        build(tower_fn=sneaky)


def test_later_tower_creating_a_tf_variable():
    def sneaky(inputs, ctx):
        if ctx.index == 1:
            tf.Variable(1.0, name="plain_variable")
        return helpers.conv_dense_model(inputs, ctx)

    with pytest.raises(ValueError, match=r"Tower 1 created variable\(s\) "
                                         r"\['tower_1/plain_variable.*tf\.compat\.v1\.get_variable"):
        build(tower_fn=sneaky)


def test_unknown_bn_mode():
    with pytest.raises(ValueError, match="Unknown bn_mode 'every_tower'.*first_tower, "
                                         "all_towers, sync"):
        build(bn_mode="every_tower")


def test_unknown_parameter_device():
    with pytest.raises(ValueError, match=r"ParameterServer\(device='tpu'\).*'cpu'.*'gpu'"):
        build(update=towerlib.ParameterServer(device="tpu"))


def test_non_optimizer():
    with pytest.raises(TypeError, match="optimizer must be a tf.compat.v1.train.Optimizer"):
        towerlib.build_train_graph(
            helpers.conv_dense_model, tuple(tf.constant(x) for x in helpers.image_batch(8)),
            "sgd", devices=helpers.cpu_devices(2))


def test_non_tensor_inputs():
    with pytest.raises(TypeError, match="Every input must be a tf.Tensor, got ndarray"):
        build(inputs=helpers.image_batch(8))


def test_bad_ema_decay():
    with pytest.raises(ValueError, match=r"ema_decay must be in \(0, 1\)"):
        build(ema_decay=1.5)


def test_batch_norm_axis_out_of_range():
    ctx = towerlib.TowerContext.single()
    with pytest.raises(ValueError, match="axis 4 is out of range for an input of rank 4"):
        towerlib.batch_norm(tf.zeros([2, 3, 3, 8]), ctx, name="bn", axis=4)


def test_conv2d_kernel_size_with_three_values():
    with pytest.raises(ValueError, match=r"kernel_size must be a positive int or a "
                                         r"\(height, width\) pair"):
        towerlib.layers.conv2d(tf.zeros([2, 5, 5, 1]), 4, (3, 3, 3), name="conv")


def test_sync_layers_called_in_a_different_order_are_refused():
    def swapped(inputs, ctx):
        images, labels = inputs
        order = ["first", "second"] if ctx.index == 0 else ["second", "first"]
        h = images
        for name in order:
            h = towerlib.batch_norm(h, ctx, name=name)
        logits = towerlib.layers.dense(towerlib.layers.flatten(h), 3, name="logits")
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=labels, logits=logits))

    with pytest.raises(ValueError, match="differs between towers.*'first'.*'second'"):
        build(tower_fn=swapped, bn_mode="sync")


def test_static_and_run_time_batch_dimensions_that_differ():
    images, labels = helpers.image_batch(8)
    fed_labels = tf.compat.v1.placeholder(tf.int32, [None])
    train = build(inputs=(tf.constant(images), fed_labels))
    with tf.compat.v1.Session(config=towerlib.session_config(2)) as session:
        session.run(tf.compat.v1.global_variables_initializer())
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match="different batch dimension from the other inputs"):
            session.run(train.train_op, {fed_labels: labels[:6]})
        session.run(train.train_op, {fed_labels: labels})  # the right size runs


def test_a_float64_loss_is_named_with_the_fix():
    def tower(inputs, ctx):
        weights = tf.compat.v1.get_variable("w", [4 * 4 * 3, 2], dtype=tf.float64)
        flat = tf.reshape(tf.cast(inputs[0], tf.float64), [-1, 4 * 4 * 3])
        return tf.reduce_mean(tf.matmul(flat, weights))

    with tf.Graph().as_default():
        with pytest.raises(TypeError, match=r"Tower 0's loss .* has dtype float64.*"
                                            r"Fix: return tf.cast\(loss, tf.float32\)"):
            towerlib.build_train_graph(
                tower, (tf.zeros([4, 4, 4, 3]), tf.zeros([4], tf.int32)),
                tf.compat.v1.train.GradientDescentOptimizer(0.1), num_towers=2,
                device_type="cpu")


def test_a_loss_that_reads_no_variable_is_named():
    """Not TensorFlow's 'No variables provided.'"""
    def tower(inputs, ctx):
        tf.compat.v1.get_variable("w", [2, 2])
        return tf.reduce_mean(inputs)

    with tf.Graph().as_default():
        with pytest.raises(ValueError, match=r"^Tower 0's loss .* does not depend on any of "
                                            r"its trainable variables \(w\)\. Fix: "):
            towerlib.build_train_graph(
                tower, tf.zeros([4, 2]), tf.compat.v1.train.GradientDescentOptimizer(0.1),
                num_towers=2, device_type="cpu")


def test_an_input_function_with_another_structure_per_tower_is_named():
    """A pair for tower 0, a triple for tower 1."""
    def input_fn(ctx):
        pair = (tf.zeros([2, 3]), tf.zeros([2], tf.int32))
        return pair if ctx.index == 0 else pair + (tf.zeros([2]),)

    def tower(inputs, ctx):
        images, labels = inputs
        return tf.reduce_mean(images * tf.compat.v1.get_variable("w", [3]))

    with tf.Graph().as_default():
        with pytest.raises(ValueError, match=r"gave tower 1 \('float32', 'int32', 'float32'\) "
                                            r"but tower 0 \('float32', 'int32'\)\. Fix: "):
            towerlib.build_train_graph(
                tower, input_fn, tf.compat.v1.train.GradientDescentOptimizer(0.1),
                num_towers=2, device_type="cpu")


@pytest.mark.skipif(bool(tf.config.list_physical_devices("GPU")), reason="needs no GPU")
def test_a_gpu_tower_this_process_does_not_have_is_named(caplog):
    """Soft placement would run it on the CPU without a word."""
    with tf.Graph().as_default(), caplog.at_level("WARNING", logger="towerlib"):
        towerlib.build_train_graph(
            lambda x, ctx: tf.reduce_mean(x * tf.compat.v1.get_variable("w", [2])),
            tf.zeros([4, 2]), tf.compat.v1.train.GradientDescentOptimizer(0.1),
            devices=["/gpu:7"])
    assert "Tower 0's device /gpu:7 does not exist: this process has 0 GPU(s)" in caplog.text

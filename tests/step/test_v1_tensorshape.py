"""TF 1 programs that turn off v2 TensorShape behaviour (shape[0] is a Dimension) still build."""

import tensorflow as tf

import towerlib


def test_build_with_v1_tensorshape():
    tf.compat.v1.disable_v2_tensorshape()
    try:
        with tf.Graph().as_default():
            def model(inputs, ctx):
                weights = tf.compat.v1.get_variable("w", [3, 1])
                return tf.reduce_mean(tf.matmul(inputs, weights))

            train = towerlib.build_train_graph(
                model, tf.ones([4, 3]), tf.compat.v1.train.GradientDescentOptimizer(0.1),
                num_towers=2, device_type="cpu")
            assert [ctx.batch_size is not None for ctx in train.contexts] == [True, True]
    finally:
        tf.compat.v1.enable_v2_tensorshape()

"""Lesson: a tf_keras ResNet on 2 towers, batch norm synchronized, on the built-in CIFAR data.

    pip install -e '.[keras]'      # towerlib and tf_keras
    python -m examples.keras_model --steps 300

The model is plain tf_keras: towerlib.KerasTower makes it a tower function, sets
`training` from the step, runs its batch norm as bn_mode says and counts its
L2 terms once. The data are the example's generated CIFAR-10-format files.
"""

import argparse
import os
import tempfile

import tensorflow as tf
import tf_keras

import towerlib
from examples.cifar10 import data, generate, input_pipeline

L2 = tf_keras.regularizers.l2(1e-4)


def conv_bn(x, filters, strides=1, relu=True):
    x = tf_keras.layers.Conv2D(filters, 3, strides, padding="same", use_bias=False,
                               kernel_regularizer=L2)(x)
    x = tf_keras.layers.BatchNormalization(momentum=0.9)(x)
    return tf_keras.layers.ReLU()(x) if relu else x


def resnet(blocks=(16, 32, 64)):
    """A small ResNet: one residual block per stage, a projection where the shape changes."""
    inputs = tf_keras.Input((32, 32, 3))
    x = conv_bn(inputs, blocks[0])
    for stage, filters in enumerate(blocks):
        strides = 1 if stage == 0 else 2
        shortcut = x
        if strides != 1 or x.shape[-1] != filters:
            shortcut = tf_keras.layers.Conv2D(filters, 1, strides, use_bias=False,
                                              kernel_regularizer=L2)(x)
        y = conv_bn(conv_bn(x, filters, strides), filters, relu=False)
        x = tf_keras.layers.ReLU()(tf_keras.layers.Add()([shortcut, y]))
    x = tf_keras.layers.GlobalAveragePooling2D()(x)
    return tf_keras.Model(inputs, tf_keras.layers.Dense(10, kernel_regularizer=L2)(x))


def cross_entropy(labels, logits):
    return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)


def main(steps, num_towers, data_dir):
    batches_dir = generate.ensure_generated(data_dir)
    train_files = data.validate_split(os.path.dirname(batches_dir), "train")
    test_files = data.validate_split(os.path.dirname(batches_dir), "test")
    with tf.Graph().as_default():
        tower = towerlib.KerasTower(resnet, cross_entropy)  # a function: builds the model
        batch = tf.compat.v1.data.make_one_shot_iterator(input_pipeline.train_dataset(
            train_files, 128, augmentation="resnet", seed=0)).get_next()
        rate = tf.compat.v1.train.cosine_decay(
            0.1, tf.compat.v1.train.get_or_create_global_step(), steps)
        train = towerlib.build_train_graph(
            tower, batch, tf.compat.v1.train.MomentumOptimizer(rate, 0.9),
            num_towers=num_towers, bn_mode="sync", update=towerlib.Replicated())
        test_batches = tf.compat.v1.data.make_initializable_iterator(
            input_pipeline.eval_dataset(test_files, 250))
        evaluation = towerlib.build_eval_graph(tower, test_batches.get_next(),
                                               num_towers=num_towers, reuse_variables=True)
        with tf.compat.v1.Session(config=towerlib.session_config(num_towers)) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(tf.compat.v1.local_variables_initializer())
            for step in range(1, steps + 1):
                _, loss = session.run([train.train_op, train.loss])
                if step % 50 == 0 or step == steps:
                    print(f"step {step}: loss {loss:.3f}")
            session.run([test_batches.initializer, evaluation.reset_op])
            while True:
                try:
                    session.run(evaluation.update_op)
                except tf.errors.OutOfRangeError:
                    break
            precision, examples = session.run([evaluation.values["correct"],
                                               evaluation.examples])
    print(f"precision@1 = {precision:.3f} on {examples} test examples")
    return precision


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--num_towers", type=int, default=2)
    parser.add_argument("--data_dir", default=os.path.join(tempfile.gettempdir(),
                                                           "towerlib_cifar10"))
    arguments = parser.parse_args()
    main(arguments.steps, arguments.num_towers, arguments.data_dir)

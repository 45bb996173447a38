"""The README's API example: a small convnet on 4 towers, trained 20 steps.

Runs anywhere: on a machine without GPUs the towers are virtual CPU devices.
"""

import numpy as np
import tensorflow as tf

import towerlib
from towerlib import layers


class SmallConvNet(towerlib.TowerModel):
    """[B, 8, 8, 3] images, 10 classes."""

    def build(self, inputs, ctx):
        images, labels = inputs
        h = layers.conv2d(images, 16, 3, name="conv1", use_bias=False, weight_decay=1e-4)
        h = tf.nn.relu(towerlib.batch_norm(h, ctx, name="bn1"))
        h = layers.global_avg_pool2d(h)
        logits = layers.dense(h, 10, name="logits", weight_decay=1e-4)
        accuracy = tf.reduce_mean(tf.cast(
            tf.equal(tf.argmax(logits, 1, output_type=tf.int32), labels), tf.float32))
        towerlib.tower_scalar(ctx, "accuracy", accuracy)
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=labels, logits=logits))


def main(num_towers=4, global_batch=64, steps=20):
    rng = np.random.RandomState(0)
    labels = rng.randint(0, 10, 512).astype(np.int32)
    images = (rng.randn(512, 8, 8, 3) + labels[:, None, None, None] / 3.0).astype(np.float32)

    with tf.Graph().as_default():
        dataset = (tf.data.Dataset.from_tensor_slices((images, labels))
                   .shuffle(512, seed=0).repeat().batch(global_batch))
        batch = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
        train = towerlib.build_train_graph(
            SmallConvNet(), batch, tf.compat.v1.train.MomentumOptimizer(0.05, 0.9),
            num_towers=num_towers, bn_mode="all_towers", ema_decay=0.99)
        with tf.compat.v1.Session(config=towerlib.session_config(num_towers)) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            for _ in range(steps):
                _, loss, accuracy = session.run(
                    [train.train_op, train.loss, train.scalars["accuracy"]])
            step = session.run(train.global_step)
            print(f"towers={num_towers} step={step} loss={loss:.3f} "
                  f"accuracy={accuracy:.2f}")
    return loss


if __name__ == "__main__":
    main()

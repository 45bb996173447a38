"""ResNet v1.5 for ImageNet (He et al. 2016, the stride in the 3x3 convolution), as a
towerlib tower model.

    resnet50   blocks (3, 4, 6, 3)   25.6M weights at 1001 classes
    resnet101  blocks (3, 4, 23, 3)
    resnet152  blocks (3, 8, 36, 3)
    resnet_mini  blocks (1, 1, 1, 1), a quarter of the width: for tests and a laptop

A 7x7/2 convolution, batch norm, relu and a 3x3/2 max pool; four stages of bottleneck
blocks (1x1, 3x3 with the stage's stride, 1x1 to four times the width, each followed by
batch norm; a 1x1 projection with batch norm where the shape changes); global average
pooling and a linear layer of NUM_CLASSES. Every convolution pads SAME. Weight decay
on every convolution and the classifier's kernel (not on batch norm's scale and offset).
Inputs: images float32 [B, S, S, 3] (NHWC), labels int32 [B]; B is the tower's share.
"""

import tensorflow as tf

import towerlib
from examples.imagenet.records import NUM_CLASSES
from towerlib import layers

__all__ = ["DEPTHS", "ResNet"]

# name -> (blocks per stage, width of the first stage)
DEPTHS = {
    "resnet50": ((3, 4, 6, 3), 64),
    "resnet101": ((3, 4, 23, 3), 64),
    "resnet152": ((3, 8, 36, 3), 64),
    "resnet_mini": ((1, 1, 1, 1), 16),
}


class ResNet(towerlib.TowerModel):
    """The tower function: (images, labels) -> the mean cross-entropy over the tower's
    examples, with its accuracy as the tower scalar 'accuracy'."""

    def __init__(self, name="resnet50", weight_decay=1e-4, bn_momentum=0.9):
        if name not in DEPTHS:
            raise ValueError(f"Unknown model {name!r}. Choose one of {', '.join(DEPTHS)}.")
        self.name, self.weight_decay, self.bn_momentum = name, weight_decay, bn_momentum
        self.blocks, self.width = DEPTHS[name]

    def build(self, inputs, ctx):
        images, labels = inputs
        logits = self.logits(images, ctx)
        correct = tf.equal(tf.argmax(logits, 1, output_type=tf.int32), labels)
        towerlib.tower_scalar(ctx, "accuracy", tf.reduce_mean(tf.cast(correct, tf.float32)))
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=labels, logits=logits))

    def logits(self, images, ctx):
        """[B, S, S, 3] -> [B, NUM_CLASSES]."""
        h = self._conv_bn(images, ctx, self.width, 7, "stem", strides=2)
        h = layers.max_pool2d(tf.nn.relu(h), 3, 2)
        for stage, blocks in enumerate(self.blocks):
            for block in range(blocks):
                strides = 2 if stage > 0 and block == 0 else 1
                h = self._bottleneck(h, ctx, self.width * 2 ** stage, strides,
                                     f"stage{stage + 1}_block{block + 1}")
        h = layers.global_avg_pool2d(h)
        return layers.dense(h, NUM_CLASSES, name="logits", weight_decay=self.weight_decay)

    def _conv_bn(self, x, ctx, filters, kernel_size, name, strides=1):
        """conv (no bias: batch norm's offset takes its place), then batch norm."""
        h = layers.conv2d(x, filters, kernel_size, name=name, strides=strides,
                          use_bias=False, weight_decay=self.weight_decay)
        return towerlib.batch_norm(h, ctx, name=name + "_bn", momentum=self.bn_momentum,
                                   epsilon=1e-5)

    def _bottleneck(self, x, ctx, filters, strides, name):
        """[B, H, W, C] -> [B, H/s, W/s, 4 * filters]."""
        with tf.compat.v1.variable_scope(name):
            h = tf.nn.relu(self._conv_bn(x, ctx, filters, 1, "conv1"))
            h = tf.nn.relu(self._conv_bn(h, ctx, filters, 3, "conv2", strides))
            h = self._conv_bn(h, ctx, 4 * filters, 1, "conv3")
            shortcut = x
            if strides != 1 or int(x.shape[-1]) != 4 * filters:
                shortcut = self._conv_bn(x, ctx, 4 * filters, 1, "projection", strides)
            return tf.nn.relu(h + shortcut)

"""ResNet50Sized: ResNet-50's weights on CIFAR-sized images, for bench/traffic.py.

Traffic per step depends on the weights' bytes (what a parameter server sends
and receives, what an all-reduce moves), not on the image size. A model with
ResNet-50's exact weight count (102.2 MB of float32) shows where the
variable updates part ways at a size where it matters; ResNet-20's 1.1 MB is
too small for any link to notice. Built on 32x32 inputs, its graph stays
small enough to build at 8 towers on a laptop: nothing is run.
"""

import tensorflow as tf

from examples.cifar10.models import CifarModel, make_model
from towerlib import layers


class ResNet50Sized(CifarModel):
    """ResNet-50's layers (He et al. 2016, table 1), on CIFAR's 32x32 images.

    7x7/2 conv 64, 3x3/2 max pool, bottleneck stages of 3, 4, 6, 3 blocks
    (1x1 w, 3x3 w, 1x1 4w with w = 64, 128, 256, 512; the stride and a
    1x1 projection with batch norm in each stage's first block; the
    stride on the 3x3 conv as in torchvision), global average pool, a
    dense layer to 1000 classes. No conv biases, towerlib batch norm:
    25,557,032 trainable float32 weights (102.2 MB), the count of
    torchvision's resnet50, plus 53,120 moving statistics. The spatial
    size changes no weight shape, so the 32x32 input keeps the build
    small: 32 -> 16 -> 8 -> 8, 4, 2, 1.
    """

    name = "resnet50_sized"
    default_weight_decay = 1e-4
    STAGES = ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2))  # (width, blocks, stride)
    CLASSES = 1000

    def _conv(self, x, filters, kernel_size, name, strides=1):
        return layers.conv2d(x, filters, kernel_size, name=name, strides=strides,
                             use_bias=False, weight_decay=self.weight_decay)

    def _bottleneck(self, x, ctx, width, strides, name):
        """[B, H, W, C] -> [B, H / strides, W / strides, 4 width]."""
        with tf.compat.v1.variable_scope(name):
            h = tf.nn.relu(self._batch_norm(self._conv(x, width, 1, "conv1"), ctx, "bn1"))
            h = tf.nn.relu(self._batch_norm(
                self._conv(h, width, 3, "conv2", strides), ctx, "bn2"))
            h = self._batch_norm(self._conv(h, 4 * width, 1, "conv3"), ctx, "bn3")
            if strides != 1 or int(x.shape[-1]) != 4 * width:
                x = self._batch_norm(self._conv(x, 4 * width, 1, "projection", strides),
                                     ctx, "projection_bn")
            return tf.nn.relu(h + x)

    def logits(self, images, ctx):
        """[B, 32, 32, 3] -> [B, 1000]."""
        h = self._conv(images, 64, 7, "conv_in", strides=2)  # [B, 16, 16, 64]
        h = tf.nn.relu(self._batch_norm(h, ctx, "bn_in"))
        h = layers.max_pool2d(h, 3, 2)  # [B, 8, 8, 64]
        for stage, (width, blocks, strides) in enumerate(self.STAGES):
            for block in range(blocks):
                h = self._bottleneck(h, ctx, width, strides if block == 0 else 1,
                                     f"stage{stage + 2}_block{block + 1}")
        h = layers.global_avg_pool2d(h)  # [B, 2048]
        return layers.dense(h, self.CLASSES, name="logits",
                            weight_decay=self.weight_decay)


def make_traffic_model(name: str):
    """'resnet50_sized' or a model of the CIFAR example ('resnet20', ...)."""
    if name == "resnet50_sized":
        return ResNet50Sized()
    return make_model(name)

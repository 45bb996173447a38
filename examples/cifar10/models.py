"""The CIFAR-10 networks of the example: the tutorial's convnet and the CIFAR ResNets.

The tower function, `CifarModel.build` (logits -> the mean cross-entropy over the tower's
examples), is the lesson's (train.py); this module gives the networks on it: the classic
tutorial's convnet and the CIFAR ResNet of He et al. (2016), `make_model` for every name,
and `inference_logits` for the evaluation and the export.

``convnet``: the multi-GPU tutorial's network with batch norm where it had LRN: two 5x5x64
convolutions, each with batch norm, relu and a 3x3 max pool of stride 2, then fully
connected layers of 384 and 192 and a linear 10; weight decay (0.004) on the fully
connected layers only, as in the tutorial.

``resnet<depth>``, depth = 6n + 2 (20, 32, 44, 56, 110; 8 for quick tests): a 3x3x16
convolution, three stages of n basic blocks with 16, 32, 64 filters (the 2nd and 3rd
stages halve the resolution in their first block, where the shortcut is a 1x1 projection
with batch norm), global average pooling, linear 10. Weight decay on every convolution
and the classifier. Inputs are standardized images float32 [B, 32, 32, 3] (NHWC) and
labels int32 [B], B the tower's own share of the global batch; with --compute_dtype the
layers compute in their input's dtype on float32 variables.
"""

import re
from typing import Optional

import tensorflow as tf

import towerlib
from examples.cifar10.train import CifarModel  # the tower function, the lesson's
from towerlib import layers

__all__ = ["CifarModel", "ConvNet", "MODEL_NAMES", "ResNet", "inference_logits",
           "make_model"]

NUM_CLASSES = 10
STANDARD_RESNET_DEPTHS = (20, 32, 44, 56, 110)
MODEL_NAMES = (("convnet",) + tuple("resnet%d" % d for d in STANDARD_RESNET_DEPTHS)
               + ("keras_resnet20",))


class ConvNet(CifarModel):
    """The classic tutorial's network, batch norm in place of LRN (see the module docstring)."""

    name = "convnet"
    default_weight_decay = 0.004  # on the fully connected layers only, as in the tutorial

    def logits(self, images, ctx):
        h = layers.conv2d(images, 64, 5, name="conv1", use_bias=False)
        h = layers.max_pool2d(tf.nn.relu(self._batch_norm(h, ctx, "conv1_bn")), 3, 2)
        h = layers.conv2d(h, 64, 5, name="conv2", use_bias=False)
        h = layers.max_pool2d(tf.nn.relu(self._batch_norm(h, ctx, "conv2_bn")), 3, 2)
        h = layers.flatten(h)  # 8 x 8 x 64
        for width, name in ((384, "local3"), (192, "local4")):
            h = layers.dense(h, width, name=name, activation=tf.nn.relu,
                             weight_decay=self.weight_decay)  # counted once, not per tower
        return layers.dense(h, NUM_CLASSES, name="softmax_linear")


class ResNet(CifarModel):
    """The CIFAR ResNet of depth 6n + 2 (see the module docstring)."""

    default_weight_decay = 2e-4
    default_augmentation = "resnet"
    STAGE_FILTERS = (16, 32, 64)

    def __init__(
        self, depth: int, weight_decay: Optional[float] = None, bn_momentum: float = 0.99
    ):
        super().__init__(weight_decay, bn_momentum)
        if depth < 8 or (depth - 2) % 6:
            raise ValueError(
                "ResNet depth must be 6n + 2 with n >= 1 (8, 14, 20, 32, 44, 56, "
                "110, ...), got %d." % depth
            )
        self.depth = depth
        self.blocks_per_stage = (depth - 2) // 6
        self.name = "resnet%d" % depth

    def _conv(self, x, filters, kernel_size, name, strides=1):
        return layers.conv2d(
            x,
            filters,
            kernel_size,
            name=name,
            strides=strides,
            use_bias=False,
            weight_decay=self.weight_decay,
        )

    def _block(self, x, ctx, filters, strides, name):
        """conv-bn-relu-conv-bn plus the shortcut, then relu: [B,H,W,C] -> [B,H/s,W/s,F]."""
        with tf.compat.v1.variable_scope(name):
            h = self._conv(x, filters, 3, "conv1", strides)
            h = tf.nn.relu(self._batch_norm(h, ctx, "bn1"))
            h = self._conv(h, filters, 3, "conv2")
            h = self._batch_norm(h, ctx, "bn2")
            if strides != 1 or int(x.shape[-1]) != filters:
                shortcut = self._batch_norm(
                    self._conv(x, filters, 1, "projection", strides), ctx, "projection_bn"
                )
            else:
                shortcut = x
            return tf.nn.relu(h + shortcut)

    def logits(self, images, ctx):
        h = self._conv(images, self.STAGE_FILTERS[0], 3, "conv_in")
        h = tf.nn.relu(self._batch_norm(h, ctx, "bn_in"))
        for stage, filters in enumerate(self.STAGE_FILTERS):
            for block in range(self.blocks_per_stage):
                strides = 2 if stage > 0 and block == 0 else 1
                h = self._block(
                    h, ctx, filters, strides, "stage%d_block%d" % (stage + 1, block + 1)
                )
        h = layers.global_avg_pool2d(h)  # [B, 64]
        return layers.dense(h, NUM_CLASSES, name="logits", weight_decay=self.weight_decay)


def make_model(
    name: str, weight_decay: Optional[float] = None, bn_momentum: float = 0.99
) -> CifarModel:
    """The model called ``name``: 'convnet', 'resnet<6n+2>' (resnet20, resnet32, ...) or
    'keras_resnet<6n+2>', the same ResNet as a tf_keras model (examples.cifar10.keras_resnet).

    Raises:
      ValueError: an unknown name, listing the known ones.
    """
    if name == "convnet":
        return ConvNet(weight_decay, bn_momentum)
    match = re.fullmatch(r"(keras_)?resnet(\d+)", name or "")
    if match and match.group(1):
        from examples.cifar10.keras_resnet import KerasResNet  # imports tf_keras when built
        return KerasResNet(int(match.group(2)), weight_decay, bn_momentum)
    if match:
        return ResNet(int(match.group(2)), weight_decay, bn_momentum)
    raise ValueError(
        "Unknown model %r. Choose one of %s (any resnet depth 6n+2 works, "
        "e.g. resnet8 for quick tests)." % (name, ", ".join(MODEL_NAMES))
    )


def inference_logits(model: CifarModel, images, reuse: bool = False):
    """Builds the model once, on one device, for inference.

    Args:
      images: standardized float32 [N, 32, 32, 3].
      reuse: True to use the variables of an earlier inference build in this graph.

    Returns:
      logits float32 [N, 10], with batch norm on its moving statistics. The variable names
      are the training graph's, so a training checkpoint restores into this graph.
    """
    towers, _ = towerlib.build_towers(
        lambda tower_images, ctx: {"logits": model.logits(tower_images, ctx)},
        images,
        num_towers=1,
        is_training=False,
        require_loss=False,
        reuse_variables=reuse,
    )
    return towers[0].outputs["logits"]

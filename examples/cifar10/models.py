"""The two CIFAR-10 models of the example, written once for every tower.

Both are `towerlib.TowerModel`s built from `towerlib.layers` and `towerlib.batch_norm`;
the batch-norm behaviour (`bn_mode`, training or inference) comes from the TowerContext
each tower is handed, so the same code serves 1 or N towers, training and evaluation.

- ``convnet``: the classic multi-GPU tutorial's network (conv 5x5x64, max-pool 3/2,
  conv 5x5x64, max-pool 3/2, fully connected 384 and 192, linear 10), on the full 32x32
  image, with batch norm after each convolution where the tutorial had local response
  normalization (LRN is rarely used today, and batch norm is what the tower modes are about).
  Weight decay on the fully connected layers only, as in the tutorial.
- ``resnet<depth>``: the CIFAR ResNet of He et al. (2016), depth = 6n + 2 (20, 32, 44, 56,
  110): a 3x3x16 convolution, three stages of n basic blocks with 16, 32, 64 filters (the
  2nd and 3rd stages halve the resolution in their first block, where the shortcut is a
  1x1 projection with batch norm), global average pooling, linear 10. Weight decay on
  every convolution and the classifier.

Inputs are standardized images float32 [B, 32, 32, 3] (NHWC) and labels int32 [B]; B is the
tower's own share of the global batch. With --compute_dtype=bfloat16 or float16 towerlib
hands the towers the images in that dtype; the layers compute in their input's dtype on
float32 variables, and `build` casts the logits to float32 before the loss.
"""

import re
from typing import Optional

import tensorflow as tf

import towerlib
from towerlib import layers

NUM_CLASSES = 10
STANDARD_RESNET_DEPTHS = (20, 32, 44, 56, 110)
MODEL_NAMES = ("convnet",) + tuple("resnet%d" % d for d in STANDARD_RESNET_DEPTHS)


class CifarModel(towerlib.TowerModel):
    """Logits from images, and the training loss of one tower.

    Subclasses implement `logits(images, ctx)`. `build` (what towerlib calls per tower)
    returns a dict: 'loss', the mean cross-entropy over this tower's examples (towerlib
    weights the towers by their share of the global batch and adds the weight decay that
    the layers registered, once), plus 'logits' [B, 10].
    """

    name = "model"
    default_weight_decay = 0.0
    default_augmentation = "tutorial"

    def __init__(self, weight_decay: Optional[float] = None, bn_momentum: float = 0.99):
        self.weight_decay = (
            self.default_weight_decay if weight_decay is None else weight_decay
        )
        if self.weight_decay < 0:
            raise ValueError("weight_decay must be >= 0, got %r" % self.weight_decay)
        if not 0.0 < bn_momentum < 1.0:
            raise ValueError("bn_momentum must be in (0, 1), got %r" % bn_momentum)
        self.bn_momentum = bn_momentum

    def logits(self, images, ctx):
        raise NotImplementedError

    def build(self, inputs, ctx):
        images, labels = inputs
        # In float32 whatever the towers compute in (--compute_dtype): a softmax over
        # bfloat16 logits would round the loss to 8 bits before it is averaged.
        logits = tf.cast(self.logits(images, ctx), tf.float32)
        with tf.name_scope("loss"):
            cross_entropy = tf.reduce_mean(
                tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
            )
            correct = tf.equal(tf.argmax(logits, axis=1, output_type=tf.int32), labels)
            towerlib.tower_scalar(
                ctx, "train_precision_at_1", tf.reduce_mean(tf.cast(correct, tf.float32))
            )
        return {"loss": cross_entropy, "logits": logits}

    def _batch_norm(self, x, ctx, name):
        return towerlib.batch_norm(x, ctx, name=name, momentum=self.bn_momentum)


class ConvNet(CifarModel):
    """The tutorial's convnet (see the module docstring); about 1.8M weights."""

    name = "convnet"
    default_weight_decay = 0.004
    default_augmentation = "tutorial"

    def logits(self, images, ctx):
        h = layers.conv2d(images, 64, 5, name="conv1", use_bias=False)
        h = tf.nn.relu(self._batch_norm(h, ctx, "conv1_bn"))
        h = layers.max_pool2d(h, 3, 2)  # 16x16
        h = layers.conv2d(h, 64, 5, name="conv2", use_bias=False)
        h = tf.nn.relu(self._batch_norm(h, ctx, "conv2_bn"))
        h = layers.max_pool2d(h, 3, 2)  # 8x8
        h = layers.flatten(h)  # 4096
        h = layers.dense(
            h, 384, name="local3", activation=tf.nn.relu, weight_decay=self.weight_decay
        )
        h = layers.dense(
            h, 192, name="local4", activation=tf.nn.relu, weight_decay=self.weight_decay
        )
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
    """The model called ``name``: 'convnet' or 'resnet<6n+2>' (resnet20, resnet32, ...).

    Raises:
      ValueError: an unknown name, listing the known ones.
    """
    if name == "convnet":
        return ConvNet(weight_decay, bn_momentum)
    match = re.fullmatch(r"resnet(\d+)", name or "")
    if match:
        return ResNet(int(match.group(1)), weight_decay, bn_momentum)
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

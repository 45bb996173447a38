"""The CIFAR ResNet written as a tf_keras model (``--model=keras_resnet20``).

The network of models.ResNet (depth 6n + 2: a 3x3x16 convolution, three stages of n
basic blocks with 16, 32, 64 filters, projection shortcuts with batch norm where the
shape changes, global average pooling, linear 10), in tf_keras layers. towerlib.KerasTower
gives each tower the model (or, with --variable_update=replicated, its copy), sets
`training` from the step and runs its batch norm as --bn_mode says; the L2 terms are
Keras kernel regularizers, counted once per step. The layers compute in float32 (the
model's own dtype policy), whatever --compute_dtype says.
"""

import tensorflow as tf

import towerlib
from examples.cifar10.train import CifarModel


class KerasResNet(CifarModel):
    """models.ResNet's network, as a tf_keras functional model."""

    default_weight_decay = 2e-4
    default_augmentation = "resnet"
    STAGE_FILTERS = (16, 32, 64)

    def __init__(self, depth, weight_decay=None, bn_momentum=0.99):
        super().__init__(weight_decay, bn_momentum)
        if depth < 8 or (depth - 2) % 6:
            raise ValueError("keras_resnet depth must be 6n + 2 with n >= 1 (8, 14, 20, 32, "
                             "...), got %d." % depth)
        self.depth = depth
        self.name = "keras_resnet%d" % depth
        self.keras = towerlib.KerasTower(self.keras_model, loss=None)

    def keras_model(self):
        import tf_keras  # only this model needs it

        # towerlib's weight decay is wd * sum(w ** 2) / 2; Keras' l2(c) is c * sum(w ** 2).
        l2 = tf_keras.regularizers.l2(self.weight_decay / 2) if self.weight_decay else None
        layers = tf_keras.layers

        def conv(x, filters, size, strides=1):
            return layers.Conv2D(filters, size, strides, padding="same", use_bias=False,
                                 kernel_initializer="he_normal", kernel_regularizer=l2)(x)

        def batch_norm(x):
            return layers.BatchNormalization(momentum=self.bn_momentum, epsilon=1e-3)(x)

        images = tf_keras.Input((32, 32, 3))
        x = layers.ReLU()(batch_norm(conv(images, self.STAGE_FILTERS[0], 3)))
        for stage, filters in enumerate(self.STAGE_FILTERS):
            for block in range((self.depth - 2) // 6):
                strides = 2 if stage > 0 and block == 0 else 1
                h = layers.ReLU()(batch_norm(conv(x, filters, 3, strides)))
                h = batch_norm(conv(h, filters, 3))
                if strides != 1 or x.shape[-1] != filters:
                    x = batch_norm(conv(x, filters, 1, strides))
                x = layers.ReLU()(layers.Add()([h, x]))
        x = layers.GlobalAveragePooling2D()(x)
        logits = layers.Dense(10, kernel_regularizer=l2)(x)
        return tf_keras.Model(images, logits, name=self.name)

    def logits(self, images, ctx):
        return tf.cast(self.keras.outputs(tf.cast(images, tf.float32), ctx), tf.float32)

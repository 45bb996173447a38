"""The bundled CIFAR-10 example: data, models, and the train/eval/export/main scripts."""

from examples.cifar10 import quiet_tensorflow

# First, before any module of the package imports TensorFlow (see quiet_tensorflow).
quiet_tensorflow.filter_startup_lines(
    user_set_level=quiet_tensorflow.LEVEL_VARIABLE in quiet_tensorflow.os.environ)
quiet_tensorflow.keep_tensorflow_quiet()

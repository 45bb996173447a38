"""Where the real-input configuration reads CIFAR-10 binary files from.

Kept free of TensorFlow so that the coordinator can prepare the data before
any worker starts.
"""

import os
import tempfile

CACHE_FOLDER = "towerlib-bench-cifar10"


def ensure_data_dir(data_dir):
    """`data_dir` if given; else the generated CIFAR-format data set in a cache folder.

    The generated set (5000 training images in the real binary format, written
    by the CIFAR-10 example's generator) is made once and reused by later runs.
    """
    if data_dir:
        return data_dir
    from examples.cifar10 import generate  # the example owns the format
    cache = os.path.join(tempfile.gettempdir(), CACHE_FOLDER)
    return generate.ensure_generated(cache)

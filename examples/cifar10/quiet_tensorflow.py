"""TensorFlow's C++ start-up log, kept quiet for the example's scripts.

On a machine without a GPU every TensorFlow process logs, at error level, that its call
to cuInit failed, before the script's first line: to a newcomer it reads as a failure.
TensorFlow reads TF_CPP_MIN_LOG_LEVEL once, when it is imported, so the package sets it
here, before any of its modules imports TensorFlow. A value the user set is kept
(TF_CPP_MIN_LOG_LEVEL=0 shows everything again).

Without an NVIDIA driver the level is 3 (errors hidden too: the GPU ones are expected
there, and a real error reaches the script as a Python exception). With a driver it is 2
(warnings and information hidden), so that a GPU problem logged at error level stays in
sight. The few lines TensorFlow's libraries print as they load (e.g. "oneDNN custom
operations are on") come before TensorFlow reads the variable and are not affected.
"""

import os

LEVEL_VARIABLE = "TF_CPP_MIN_LOG_LEVEL"
NVIDIA_DRIVER_FILE = "/proc/driver/nvidia/version"
WITHOUT_GPU_DRIVER = "3"  # hides ERROR: the failed cuInit of a CPU machine
WITH_GPU_DRIVER = "2"  # hides WARNING and INFO


def quiet_level(driver_file: str = NVIDIA_DRIVER_FILE) -> str:
    """The level the scripts use when the user set none."""
    return WITH_GPU_DRIVER if os.path.exists(driver_file) else WITHOUT_GPU_DRIVER


def keep_tensorflow_quiet(environ=os.environ) -> str:
    """Sets TF_CPP_MIN_LOG_LEVEL unless it is set; returns the level in effect.

    It only works before TensorFlow is imported (the package calls it first thing).
    """
    return environ.setdefault(LEVEL_VARIABLE, quiet_level())

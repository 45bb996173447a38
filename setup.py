"""towerlib: graph-mode multi-device data-parallel training for TensorFlow."""

import pathlib
import re

import setuptools

HERE = pathlib.Path(__file__).resolve().parent


def package_version():
    """towerlib.__version__, read from the file's text: the one place the version is
    written, and importing the package here would need TensorFlow before it is installed."""
    init = (HERE / "towerlib" / "__init__.py").read_text(encoding="utf-8")
    found = re.search(r'^__version__ = "([^"]+)"$', init, re.M)
    if found is None:
        raise RuntimeError("towerlib/__init__.py has no line __version__ = \"...\"")
    return found.group(1)


setuptools.setup(
    name="towerlib",
    version=package_version(),
    description=(
        "TensorFlow 1.x-style graph-mode multi-GPU data-parallel training: "
        "tower replication, gradient aggregation and batch-norm modes."),
    long_description=(HERE / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    packages=setuptools.find_packages(include=["towerlib", "towerlib.*"]),
    # What CI tests: Python 3.11 and TensorFlow 2.21. It relies on TF 1.x internals
    # (towerlib.internals) that a new TensorFlow release may change.
    python_requires=">=3.11,<3.12",
    install_requires=["tensorflow>=2.21,<2.22", "numpy", "absl-py"],
    # tf_keras brings tf.compat.v1.layers back, for the tests of TF 1 models;
    # pytest-xdist runs the suite on every core; matplotlib draws traced steps.
    extras_require={
        "test": ["pytest", "pytest-xdist", "tensorboard", "tf_keras>=2.21,<2.22",
                 "matplotlib"],
        "plot": ["matplotlib"],
    },
)

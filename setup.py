"""towerlib: graph-mode multi-device data-parallel training for TensorFlow."""

import setuptools

setuptools.setup(
    name="towerlib",
    version="0.1.0",
    description=(
        "TensorFlow 1.x-style graph-mode multi-GPU data-parallel training: "
        "tower replication, gradient aggregation and batch-norm modes."),
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    packages=setuptools.find_packages(include=["towerlib", "towerlib.*"]),
    python_requires=">=3.9",
    install_requires=["tensorflow>=2.15", "numpy", "absl-py"],
    extras_require={"test": ["pytest", "tensorboard"]},
)

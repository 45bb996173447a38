"""A shim for tools that still run setup.py: the project is declared in pyproject.toml.

setuptools reads the name, version, dependencies, extras and packages from
pyproject.toml; nothing is declared here. `pip install -e .` and `pip wheel .`
build through pyproject.toml's backend (setuptools.build_meta), which runs this file.
"""

import setuptools

setuptools.setup()

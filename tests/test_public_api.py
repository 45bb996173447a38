"""The public API is imported on first use: every name `__all__` lists resolves, and
`import towerlib` alone imports no TensorFlow (towerlib-launch relies on it)."""

import subprocess
import sys

import pytest

import towerlib
from towerlib import cluster as cluster_lib


@pytest.mark.parametrize("package", [towerlib, cluster_lib], ids=lambda p: p.__name__)
def test_every_public_name_resolves(package):
    missing = [name for name in package.__all__ if getattr(package, name, None) is None]
    assert missing == []
    assert set(package.__all__) <= set(dir(package))


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="module 'towerlib' has no attribute 'nope'"):
        towerlib.nope  # noqa: B018


@pytest.mark.slow   # a fresh Python
def test_a_submodule_reached_as_an_attribute_still_resolves():
    """As with the eager import: `import towerlib` then towerlib.run.loop_hooks."""
    code = ("import towerlib; print(towerlib.run.loop_hooks.__name__, "
            "towerlib.trace.analyze_step.__name__, towerlib.cluster.spec.__name__)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.stdout.split() == ["towerlib.run.loop_hooks", "analyze_step",
                                   "towerlib.cluster.spec"], done.stderr[-2000:]


@pytest.mark.slow   # a fresh Python
def test_importing_towerlib_imports_no_tensorflow():
    code = ("import sys, towerlib, towerlib.cluster.exits; "
            "print('tensorflow' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.strip() == "False", done.stderr

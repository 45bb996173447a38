"""The package builds from pyproject.toml; setup.py at the top is a shim that declares nothing.

The builds run in a copy of the project under tmp_path (a build writes build/ and
*.egg-info beside the sources) with pip's build isolation: pyproject.toml asks for
setuptools>=77, which pip fetches from the package index once and caches.
"""

import ast
import os
import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
BUILD_INPUTS = ("towerlib", "pyproject.toml", "setup.py", "README.md", "LICENSE")


def _version():
    """towerlib.__version__, read from the file's syntax tree as setuptools reads it."""
    tree = ast.parse((ROOT / "towerlib" / "__init__.py").read_text(encoding="utf-8"))
    return next(node.value.value for node in tree.body if isinstance(node, ast.Assign)
                and [t.id for t in node.targets if isinstance(t, ast.Name)] == ["__version__"])


def _project_copy(tmp_path):
    source = tmp_path / "source"
    source.mkdir()
    for name in BUILD_INPUTS:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(ROOT / name, source / name)
    return source


def _pip(*args, cwd):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([sys.executable, "-m", "pip", *args, "--no-input", "-q"],
                            cwd=cwd, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]


def test_setup_py_is_a_shim_that_defers_to_pyproject():
    tree = ast.parse((ROOT / "setup.py").read_text(encoding="utf-8"))
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)]
    assert [ast.unparse(call) for call in calls] == ["setuptools.setup()"]
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert 'build-backend = "setuptools.build_meta"' in pyproject  # the backend runs setup.py
    assert 'name = "towerlib"' in pyproject


@pytest.mark.slow  # pip builds in a fresh build environment
def test_a_wheel_builds_with_the_package_and_pyproject_metadata(tmp_path):
    source = _project_copy(tmp_path)
    _pip("wheel", "--no-deps", "-w", str(tmp_path / "wheels"), ".", cwd=source)

    (wheel,) = (tmp_path / "wheels").glob("towerlib-*.whl")
    assert wheel.name == f"towerlib-{_version()}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(f"towerlib-{_version()}.dist-info/METADATA").decode()
        entry_points = archive.read(f"towerlib-{_version()}.dist-info/entry_points.txt")
    packaged = {name for name in names if not name.startswith("towerlib-")}
    sources = {path.relative_to(ROOT).as_posix() for path in (ROOT / "towerlib").rglob("*.py")}
    assert packaged == sources  # every module, and nothing else (no setup.py, no tests)
    assert "Requires-Dist: tensorflow<2.22,>=2.21" in metadata
    assert "Requires-Python: >=3.10" in metadata
    assert b"towerlib-launch = towerlib.launch.command_line:main" in entry_points


@pytest.mark.slow  # a fresh venv, and pip builds in a fresh build environment
def test_an_editable_install_imports_the_sources_in_place(tmp_path):
    """Into a venv of its own: `pip install --prefix` would uninstall the towerlib of the
    environment running the tests (the same distribution), and every later test that
    starts a Python would no longer find it."""
    source = _project_copy(tmp_path)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    installed = subprocess.run(
        [str(python), "-m", "pip", "install", "--no-deps", "--no-input", "-q", "-e", "."],
        cwd=source, capture_output=True, text=True, timeout=300, env=environ)
    assert installed.returncode == 0, installed.stdout[-2000:] + installed.stderr[-3000:]
    found = subprocess.run(  # `import towerlib` loads no TensorFlow (a lazy public API)
        [str(python), "-c", "import towerlib; print(towerlib.__file__)"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, env=environ)
    assert found.returncode == 0, found.stderr[-2000:]
    assert pathlib.Path(found.stdout.strip()) == source / "towerlib" / "__init__.py"
    assert (venv / "bin" / "towerlib-launch").is_file()
    # The environment running the tests still imports its own towerlib from anywhere.
    ours = subprocess.run([sys.executable, "-c", "import towerlib"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60, env=environ)
    assert ours.returncode == 0, ours.stderr[-2000:]

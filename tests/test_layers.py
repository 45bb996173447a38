"""towerlib's packages in layers: each imports only from the layers below it.

Read bottom to top; the members of one layer are independent (none imports another).
A member is a package (`step`) or a module (`checks.problems`). Every import counts,
at module level or inside a function, absolute or relative, and an import through the
package face (`from towerlib import run_training`, `towerlib.run_training` after
`import towerlib`) counts as an import of the module that defines the name.
docs/layout.md shows the same order.
"""

import ast
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1] / "towerlib"

LAYERS = [
    ["internals", "lazy_names"],            # TensorFlow's internals; names imported on use
    ["exchange", "trace"],                  # cross-tower reductions; reading traced steps
    ["update"],                             # parameter server, replicated copies
    ["batchnorm", "precision"],             # batch norm across towers; dtypes, guards
    ["checks"],                             # build-time checks of towers and data
    ["step", "layers", "schedules", "optimizers", "data"],  # the step; layers; rates;
    #                                        LARS, LAMB; record sources read by index
    ["keras"],                              # the Keras front end (KerasTower)
    ["run"],                                # the training loop
    ["cluster"],                            # several machines
    ["launch"],                             # starting and restarting a job's processes
]


def member_of(module):
    """The layer member a dotted module name under towerlib belongs to, or None."""
    for members in LAYERS:
        for member in members:
            if module == member or module.startswith(member + "."):
                if "." not in member:
                    # A module member ('checks.problems') is more specific.
                    specific = [m for layer in LAYERS for m in layer
                                if "." in m and (module == m or module.startswith(m + "."))]
                    return specific[0] if specific else member
                return member
    return None


def layer_index(member):
    return next(i for i, members in enumerate(LAYERS) if member in members)


class Package:
    """A copy of towerlib on disk: its modules, and what its face (__init__.py) re-exports."""

    def __init__(self, root):
        self.root = root
        self.face = {}  # a name towerlib/__init__.py binds -> the module that defines it
        init = root / "__init__.py"
        for node in ast.walk(ast.parse(init.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                module = self.absolute(node, package="")
                for alias in node.names:
                    self.face[alias.asname or alias.name] = self.named(module, alias.name)

    def is_module(self, dotted):
        path = self.root.joinpath(*dotted.split("."))
        return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()

    def absolute(self, node, package):
        """The dotted module under towerlib an ImportFrom reads ('' is towerlib itself),
        None if it is outside towerlib; ValueError if it is relative beyond towerlib."""
        if node.level == 0:
            if node.module != "towerlib" and not node.module.startswith("towerlib."):
                return None
            return node.module[len("towerlib."):] if "." in node.module else ""
        parts = package.split(".") if package else []
        if node.level - 1 > len(parts):
            raise ValueError("a relative import beyond towerlib")
        base = parts[:len(parts) - (node.level - 1)]
        return ".".join(base + ([node.module] if node.module else []))

    def named(self, module, name):
        """What `from <module> import <name>` reaches: a submodule, through the face the
        module defining the name, else an attribute of `module`."""
        dotted = f"{module}.{name}" if module else name
        if self.is_module(dotted):
            return dotted
        if module == "":
            return self.face.get(name, f"<towerlib.{name}, not on the package face>")
        return dotted


def imports_of(path, package, tree):
    """(imported towerlib module, line) for every import in the file, resolved."""
    face_names = set()  # names bound to towerlib itself by `import towerlib [as x]`
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            try:
                module = tree.absolute(node, package)
            except ValueError as error:
                yield f"<{error}>", node.lineno
                continue
            if module is not None:
                for alias in node.names:
                    yield tree.named(module, alias.name), node.lineno
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "towerlib" or alias.name.startswith("towerlib."):
                    if alias.name != "towerlib":
                        yield alias.name[len("towerlib."):], node.lineno
                    if alias.asname is None or alias.name == "towerlib":
                        face_names.add(alias.asname or "towerlib")
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in face_names):
            yield tree.named("", node.attr), node.lineno


def violations(root=ROOT):
    tree = Package(root)
    found = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        module = ".".join(parts)
        if module == "__init__":
            continue  # the public API re-exports every layer
        package = ".".join(parts[:-1])  # step/__init__.py and step/build.py: 'step'
        importer = member_of(module)
        for imported, line in imports_of(path, package, tree):
            target = member_of(imported)
            if target == importer:
                continue
            if target is None or layer_index(target) >= layer_index(importer):
                where = "not below it" if target else "not in a layer"
                found.append(f"towerlib/{path.relative_to(root)}:{line} {importer} imports "
                             f"{imported} ({target or 'outside the layers'}, {where})")
    return found


def test_every_module_belongs_to_a_layer():
    modules = [".".join(p.relative_to(ROOT).with_suffix("").parts) for p in ROOT.rglob("*.py")]
    assert [m for m in modules if m != "__init__" and member_of(m) is None] == []


def test_no_import_goes_up_or_sideways():
    assert violations() == []


# Each kind of import a module of `step` could use to reach `run`, a layer above it (or
# `layers`, beside it); planted in a copy of the package, the check must name it.
PLANTED = {
    "absolute": "from towerlib.run.trainer import run_training\n",
    "absolute module": "import towerlib.run.trainer\n",
    "absolute package": "from towerlib.run import trainer\n",
    "relative": "from ..run.trainer import run_training\n",
    "relative package": "from .. import run\n",
    "relative beyond towerlib": "from ... import towerlib\n",
    "through the face": "from towerlib import run_training\n",
    "through the face, renamed": "from towerlib import mixed_precision as mp, Evaluation\n",
    "face attribute": "import towerlib\n\n\ndef train(graph):\n"
                      "    return towerlib.run_training(graph)\n",
    "face attribute, renamed": "import towerlib as tl\n\n\ndef train(graph):\n"
                               "    return tl.run_training(graph)\n",
    "inside a function": "def train(graph):\n    from ..run import trainer\n"
                         "    return trainer.run_training(graph)\n",
    "sideways": "from towerlib.layers import conv2d\n",
    "sideways, relative": "from ..layers import conv2d\n",
    "a name the face does not have": "from towerlib import no_such_name\n",
}


@pytest.fixture(scope="module")
def package_copy(tmp_path_factory):
    copy = tmp_path_factory.mktemp("layers") / "towerlib"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return copy


@pytest.mark.parametrize("kind", sorted(PLANTED))
def test_a_planted_import_across_the_layers_is_found(package_copy, kind):
    planted = package_copy / "step" / "planted.py"
    planted.write_text(PLANTED[kind], encoding="utf-8")
    try:
        found = violations(package_copy)
    finally:
        planted.unlink()
    assert found and all(line.startswith("towerlib/step/planted.py:") for line in found), found


@pytest.mark.parametrize("source", [
    "from towerlib.update.base import VariableUpdate\n",
    "from ..update import base\nfrom . import build\nfrom .build import build_train_graph\n",
    "from towerlib import exchange\nimport towerlib\n\n\ndef f():\n    return towerlib.trace\n",
])
def test_an_import_from_below_or_within_is_allowed(package_copy, source):
    planted = package_copy / "step" / "planted.py"
    planted.write_text(source, encoding="utf-8")
    try:
        assert violations(package_copy) == []
    finally:
        planted.unlink()


def test_ruff_refuses_relative_imports_with_the_project_rules(tmp_path):
    module = tmp_path / "towerlib" / "step" / "planted.py"
    module.parent.mkdir(parents=True)
    for package in (module.parent, module.parent.parent):
        (package / "__init__.py").write_text("")
    module.write_text("from ..run import trainer\nfrom . import build\n\n"
                      "print(trainer, build)\n", encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise",
         "--config", str(ROOT.parent / "pyproject.toml"), str(module)],
        cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout.count("TID252") == 2, result.stdout


def test_the_step_across_workers_has_one_home():
    """build.py reads the same phases on one machine and across workers: what crosses
    between workers is built in towerlib/step/across_workers.py alone (options.py only
    judges whether the update can span the group)."""
    step = ROOT / "step"
    deciding = sorted(path.name for path in step.glob("*.py")
                      if "spans_workers" in path.read_text(encoding="utf-8"))
    assert deciding == ["across_workers.py", "options.py"], deciding

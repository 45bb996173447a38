"""towerlib's packages in layers: each imports only from the layers below it.

Read bottom to top; the members of one layer are independent (none imports another).
A member is a package (`step`) or a module (`checks.validation`). Every import counts,
at module level or inside a function. docs/layout.md shows the same order.
"""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1] / "towerlib"

LAYERS = [
    ["internals"],                          # TensorFlow's and tf_keras' internals, one each
    ["exchange", "trace"],                  # cross-tower reductions; reading traced steps
    ["update"],                             # parameter server, replicated copies
    ["batchnorm", "precision"],             # batch norm across towers; dtypes, guards
    ["checks"],                             # build-time checks of towers and data
    ["step", "layers", "schedules", "optimizers"],  # the step; layers; rates; LARS, LAMB
    ["checks.validation"],                  # validate_config: the step's and the loop's options
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
                    # A module member ('checks.validation') is more specific.
                    specific = [m for layer in LAYERS for m in layer
                                if "." in m and (module == m or module.startswith(m + "."))]
                    return specific[0] if specific else member
                return member
    return None


def layer_index(member):
    return next(i for i, members in enumerate(LAYERS) if member in members)


def imports_of(path):
    """(imported towerlib module, line) for every import in the file."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and (
                node.module == "towerlib" or node.module.startswith("towerlib.")):
            base = node.module[len("towerlib."):] if "." in node.module else ""
            for alias in node.names:
                yield (f"{base}.{alias.name}" if base else alias.name), node.lineno
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("towerlib."):
                    yield alias.name[len("towerlib."):], node.lineno


def violations():
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        if module == "__init__":
            continue  # the public API re-exports every layer
        importer = member_of(module)
        for imported, line in imports_of(path):
            target = member_of(imported)
            if target is None or target == importer:
                continue
            if layer_index(target) >= layer_index(importer):
                found.append(f"towerlib/{path.relative_to(ROOT)}:{line} {importer} imports "
                             f"{imported} ({target}, not below it)")
    return found


def test_every_module_belongs_to_a_layer():
    modules = [".".join(p.relative_to(ROOT).with_suffix("").parts) for p in ROOT.rglob("*.py")]
    assert [m for m in modules if m != "__init__" and member_of(m) is None] == []


def test_no_import_goes_up_or_sideways():
    assert violations() == []

"""A package's public names imported on first use, read from its TYPE_CHECKING imports.

    # towerlib/cluster/__init__.py
    if TYPE_CHECKING:
        from towerlib.cluster.allreduce_job import WorkerLostError   # written as usual
    __getattr__ = lazy_loader(__name__, __file__)                # imported when used

So `import towerlib` (and towerlib-launch) loads no TensorFlow until a name
that needs it is used, while the imports stay written for readers, IDEs and
the API reference. The bottom layer: it imports nothing of towerlib.
"""

import ast
import importlib
import importlib.util
import sys

__all__ = ["lazy_loader"]


def lazy_loader(package, init_path):
    """A module __getattr__ for `package`: its public names are the imports under
    `if TYPE_CHECKING:` in its __init__ (init_path); each is imported on first use
    and then kept as a plain attribute."""
    with open(init_path, encoding="utf-8") as source:
        tree = ast.parse(source.read())
    table = {}
    for node in tree.body:
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for statement in node.body:
                if isinstance(statement, ast.ImportFrom):
                    for alias in statement.names:
                        table[alias.asname or alias.name] = (statement.module, alias.name)

    def __getattr__(name):
        if name not in table:
            if importlib.util.find_spec(f"{package}.{name}") is None:
                raise AttributeError(f"module {package!r} has no attribute {name!r}")
            # A submodule reached as an attribute (`towerlib.run.loop_hooks`), with what
            # the eager import put in it: the public names it defines are imported too.
            submodule = importlib.import_module(f"{package}.{name}")
            for source, _ in table.values():
                if source.startswith(f"{package}.{name}."):
                    importlib.import_module(source)
            return submodule
        source, attribute = table[name]
        module = importlib.import_module(source)
        # A name the module defines, else its submodule (`from towerlib.run import hooks`).
        value = vars(module)[attribute] if attribute in vars(module) else \
            importlib.import_module(f"{source}.{attribute}")
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__

"""TensorFlow's import without CPython's cyclic garbage collector, in every test process.

`import tensorflow` creates about 500,000 objects the collector tracks. While it runs, the
collector's full passes over everything allocated so far come again and again; after it,
every full pass and the last ones at interpreter exit walk them all once more, though they
live as long as the process. Together that is about 1.5 of the 3.5 CPU seconds a process
spends to import TensorFlow and exit, and the suite starts about 150 such processes.

So while `tensorflow` is imported the collector is paused; afterwards gc.freeze() moves
every object there is out of the collector's sight (module-level objects, kept to the end
anyway) and the collector runs again as before. The import's own garbage (about 180,000
small objects; no measurable resident memory) is frozen with them rather than collected,
which would cost 0.2 s a process. Nothing the process computes changes, only when the
collector looks at what: objects made afterwards (graphs, sessions, the test's own) are
collected as usual.

tests/conftest.py does this in the test processes themselves (install()) and puts this
folder on the PYTHONPATH of every process the tests start, where Python imports this
module at start-up (site's sitecustomize hook). Standard library only, and silent: a
process that never imports TensorFlow only gets one more entry in sys.meta_path.
"""

import gc
import sys

_MARK = "_towerlib_tests_tf_import_gc"  # one installed finder per process


class TensorFlowImportWithoutGC:
    """A meta path finder for the name 'tensorflow' only: it finds the package as the
    finders after it would, and runs its import with the collector paused, then frozen."""

    _towerlib_tests_tf_import_gc = True

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "tensorflow" or "tensorflow" in sys.modules:
            return None
        spec = None
        later = sys.meta_path[sys.meta_path.index(self) + 1:] if self in sys.meta_path else []
        for finder in later:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find else None
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_module_without_gc(module):
            enabled = gc.isenabled()
            gc.disable()
            try:
                exec_module(module)
            except BaseException:
                if enabled:
                    gc.enable()
                raise
            if enabled:
                gc.freeze()
                gc.enable()

        spec.loader.exec_module = exec_module_without_gc
        return spec


def install():
    """Puts the finder first in sys.meta_path, once per process."""
    if not any(getattr(finder, _MARK, False) for finder in sys.meta_path):
        sys.meta_path.insert(0, TensorFlowImportWithoutGC())


install()

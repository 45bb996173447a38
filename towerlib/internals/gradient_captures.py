"""tf.gradients inside a function body, with its capture lookups indexed.

When tf.gradients runs while a FuncGraph is built (the accumulation loop's
body, towerlib.step.micro_loop), it walks forward from the variables through
every tensor they reach, and for each tensor scans the body's whole capture
list for a placeholder standing for it (``gradients_util._Consumers``), and
for each placeholder input it meets scans the list again for the outer
tensor (``_MaybeCaptured``). The cost is tensors x captures: at 8 towers of a
ResNet-50-sized model (150k tensors reached, 181 captures; 1,300 with
replicated variables) about 2 s of a 21 s profiled build.

`indexed_capture_lookups()` swaps those two functions, while it is entered,
for ones that look captures up in a dict built from the same
``FuncGraph.captures`` list. They return the same tensors in the same order,
so the graph built is the same (tests/internals/test_internals_gradient_captures.py
builds graphs both ways and compares their GraphDefs, function-name counters
aside). Relies on:

- gradients_util's ``_Consumers(t, func_graphs)``, ``_MaybeCaptured(t)`` and
  ``_IsFunction(graph)``, called by tf.gradients as module globals; if a
  release removes them or changes their parameters, the context does nothing
  (the build is slower, not wrong) and the test fails saying so;
- ``FuncGraph.captures`` returning the same list object until the captures
  change, and a new list after (FunctionCaptures caches it). The index is
  rebuilt whenever the object or its length changes; a graph whose
  ``captures`` is a new list at every call is scanned as before.

The swap is process-wide while entered (TensorFlow looks the functions up
as module globals); entries nest and may overlap across threads: the first
installs, the last restores, under a lock.
"""

import collections
import contextlib
import inspect
import threading
import weakref

from tensorflow.python.framework import ops
from tensorflow.python.ops import gradients_util

__all__ = ["indexed_capture_lookups", "available"]

_SIGNATURES = {"_Consumers": ["t", "func_graphs"], "_MaybeCaptured": ["t"],
               "_IsFunction": ["graph"]}
_lock = threading.Lock()
_installed = {"depth": 0, "originals": None}

# One graph's captures, indexed: `captures` the list it was built from.
_Entry = collections.namedtuple("_Entry", "captures length placeholders_of outer_of")


def available() -> bool:
    """Whether this TensorFlow has the functions the context replaces, as it calls them."""
    swapped_out = _installed["originals"] or {}   # while entered: TensorFlow's own
    for name, parameters in _SIGNATURES.items():
        function = swapped_out.get(name) or getattr(gradients_util, name, None)
        if not callable(function):
            return False
        try:
            if list(inspect.signature(function).parameters) != parameters:
                return False
        except (TypeError, ValueError):
            return False
    return True


class _CaptureIndex:
    """Per FuncGraph: outer tensor -> its placeholders, placeholder -> outer tensor."""

    def __init__(self):
        self._by_graph = weakref.WeakKeyDictionary()

    def lookup(self, graph):
        """The graph's _Entry, or None when its captures list is not cached by TF."""
        captures = graph.captures
        entry = self._by_graph.get(graph)
        if entry is not None and entry.captures is captures and entry.length == len(captures):
            return entry
        if graph.captures is not captures:  # a new list per call: nothing to key on
            return None
        placeholders_of, outer_of = {}, {}
        for outer, inner in captures:
            placeholders_of.setdefault(id(outer), []).append(inner)
            outer_of.setdefault(id(inner), outer)
        # The entry holds the list, so the ids of the tensors in it stay theirs.
        entry = _Entry(captures, len(captures), placeholders_of, outer_of)
        self._by_graph[graph] = entry
        return entry

    def consumers(self, tensor, func_graphs):
        """gradients_util._Consumers: tensor's consumers, through the captures of func_graphs."""
        found = tensor.consumers()
        own_graph = tensor.graph
        for graph in func_graphs:
            if graph is own_graph:  # a graph never captures its own tensors
                continue
            entry = self.lookup(graph)
            placeholders = (entry.placeholders_of.get(id(tensor), ()) if entry is not None
                            else [inner for outer, inner in graph.captures if outer is tensor])
            for placeholder in placeholders:
                found.extend(self.consumers(placeholder, func_graphs))
        return found

    def maybe_captured(self, tensor):
        """gradients_util._MaybeCaptured: the outer tensor a capture placeholder stands for."""
        if (not isinstance(tensor, ops.EagerTensor)
                and gradients_util._IsFunction(tensor.op.graph)  # pylint: disable=protected-access
                and tensor.op.type == "Placeholder"):
            entry = self.lookup(tensor.op.graph)
            if entry is not None:
                outer = entry.outer_of.get(id(tensor))
            else:
                outer = next((o for o, inner in tensor.op.graph.captures if inner is tensor),
                             None)
            if outer is not None:
                return self.maybe_captured(outer)
        return tensor


@contextlib.contextmanager
def indexed_capture_lookups():
    """Within: tf.gradients in a function body looks its captures up by index."""
    with _lock:
        usable = _installed["depth"] > 0 or available()
        if usable:
            _installed["depth"] += 1
        if usable and _installed["depth"] == 1:
            index = _CaptureIndex()
            _installed["originals"] = {name: getattr(gradients_util, name)
                                       for name in ("_Consumers", "_MaybeCaptured")}
            gradients_util._Consumers = index.consumers  # pylint: disable=protected-access
            gradients_util._MaybeCaptured = index.maybe_captured  # pylint: disable=protected-access
    if not usable:  # the build is slower, not wrong
        yield
        return
    try:
        yield
    finally:
        with _lock:
            _installed["depth"] -= 1
            if _installed["depth"] == 0:
                for name, original in _installed["originals"].items():
                    setattr(gradients_util, name, original)
                _installed["originals"] = None

"""tf.gradients inside a function body, with its capture lookups indexed.

When tf.gradients runs while a FuncGraph is built (the accumulation loop's
body, towerlib.step.micro_loop), it walks forward from the variables through
every tensor they reach, and for each tensor scans the body's whole capture
list for a placeholder standing for it (``gradients_util._Consumers``), and
for each placeholder input it meets scans the list again for the outer
tensor (``_MaybeCaptured``). The cost is tensors x captures: at 8 towers of a
ResNet-50-sized model (150k tensors reached, 181 captures; 1,300 with
replicated variables) about 2 s of a 21 s build, the part of the loop's build
that grew with its captures.

`indexed_capture_lookups()` swaps those two functions, while it is entered,
for ones that look captures up in a dict built from the same
``FuncGraph.captures`` list (rebuilt whenever that list changes). They
return the same tensors in the same order, so the graph built is the same,
byte for byte (tests/internals/test_internals_gradient_captures.py builds
one both ways). Relies on gradients_util's two private functions, their
signatures ``(t, func_graphs)`` and ``(t)``, and ``_IsFunction``; if a release
removes them, the context does nothing (the build is slower, not wrong) and
the test fails saying so.

The swap is process-wide while entered (TensorFlow looks the functions up
as module globals); entries nest and may overlap across threads: the first
installs, the last restores, under a lock.
"""

import contextlib
import threading

from tensorflow.python.framework import ops
from tensorflow.python.ops import gradients_util

__all__ = ["indexed_capture_lookups", "available"]

_NAMES = ("_Consumers", "_MaybeCaptured", "_IsFunction")
_lock = threading.Lock()
_installed = {"depth": 0, "originals": None}


def available() -> bool:
    """Whether this TensorFlow has the functions the context replaces."""
    return all(callable(getattr(gradients_util, name, None)) for name in _NAMES)


class _CaptureIndex:
    """Per FuncGraph: outer tensor -> its placeholders, placeholder -> outer tensor."""

    def __init__(self):
        self._by_graph = {}   # graph -> (captures list, its length, by outer, by inner)

    def lookup(self, graph):
        captures = graph.captures
        entry = self._by_graph.get(graph)
        if entry is None or entry[0] is not captures or entry[1] != len(captures):
            by_outer, by_inner = {}, {}
            for outer, inner in captures:
                by_outer.setdefault(id(outer), []).append(inner)
                by_inner.setdefault(id(inner), outer)
            # The list is held, so the ids of the tensors in it stay theirs.
            entry = (captures, len(captures), by_outer, by_inner)
            self._by_graph[graph] = entry
        return entry

    def consumers(self, tensor, func_graphs):
        found = tensor.consumers()
        own_graph = tensor.graph
        for graph in func_graphs:
            if graph is own_graph:  # a graph never captures its own tensors
                continue
            for placeholder in self.lookup(graph)[2].get(id(tensor), ()):
                found.extend(self.consumers(placeholder, func_graphs))
        return found

    def maybe_captured(self, tensor):
        if (not isinstance(tensor, ops.EagerTensor)
                and gradients_util._IsFunction(tensor.op.graph)  # pylint: disable=protected-access
                and tensor.op.type == "Placeholder"):
            outer = self.lookup(tensor.op.graph)[3].get(id(tensor))
            if outer is not None:
                return self.maybe_captured(outer)
        return tensor


@contextlib.contextmanager
def indexed_capture_lookups():
    """Within: tf.gradients in a function body looks its captures up by index."""
    if not available():
        yield
        return
    with _lock:
        if _installed["depth"] == 0:
            index = _CaptureIndex()
            _installed["originals"] = {name: getattr(gradients_util, name)
                                       for name in ("_Consumers", "_MaybeCaptured")}
            gradients_util._Consumers = index.consumers  # pylint: disable=protected-access
            gradients_util._MaybeCaptured = index.maybe_captured  # pylint: disable=protected-access
        _installed["depth"] += 1
    try:
        yield
    finally:
        with _lock:
            _installed["depth"] -= 1
            if _installed["depth"] == 0:
                for name, original in _installed["originals"].items():
                    setattr(gradients_util, name, original)
                _installed["originals"] = None

"""Pairing the towers' calls: the k-th call of every tower is one exchange.

Every tower of a build makes the same reductions in the same order. The
ledger records each call, compares it with the same call of the tower that
made it first (kind, name, dtype, shapes) and hands out one key per paired
call, so that a mismatch is an error while the graph is built instead of a
collective waiting forever at run time. Forward calls and the backward calls
that tf.gradients builds are paired separately, each in creation order.
"""

import dataclasses
import threading
from typing import Callable, List, Optional, Tuple

import tensorflow as tf

__all__ = ["CallLedger", "CallRecord", "CollectiveMismatchError", "shape_tuple"]


class CollectiveMismatchError(ValueError):
    """Towers of one reducer made different sequences of reductions.

    Raised while the graph is built: run, such a graph would wait forever (or
    until the timeout) for a partner call that does not exist, or, through
    the graph transport, fail for want of it.
    """


@dataclasses.dataclass(frozen=True)
class CallRecord:
    """What one tower asked for in one call; compared across towers."""

    kind: str  # 'sum' | 'gather' | 'gather_unordered', '/backward' appended for gradients
    name: str
    shapes: Tuple[Tuple[Optional[int], ...], ...]
    dtype: str

    def describe(self) -> str:
        shapes = ", ".join(str(list(s)) for s in self.shapes)
        return f"{self.kind} '{self.name}' of {self.dtype} [{shapes}]"

    def conflicts_with(self, other: "CallRecord") -> bool:
        # The name is the layer's variable scope, the same in every tower: two
        # same-shaped layers called in a different order must not pair up.
        if (self.kind, self.name, self.dtype, len(self.shapes)) != (
                other.kind, other.name, other.dtype, len(other.shapes)):
            return True
        return any(not tf.TensorShape(mine).is_compatible_with(tf.TensorShape(theirs))
                   for mine, theirs in zip(self.shapes, other.shapes))


def shape_tuple(tensor) -> Tuple[Optional[int], ...]:
    """The static shape of `tensor` as a tuple; its rank must be known."""
    if tensor.shape.rank is None:
        raise ValueError(
            f"Cannot reduce {tensor.name} across towers: its rank is unknown. "
            "Give it a static rank (tf.ensure_shape / set_shape)."
        )
    return tuple(tensor.shape.as_list())


class _Direction:
    """The calls of one direction (forward or backward) of every tower."""

    def __init__(self, num_towers):
        self.calls: List[List[CallRecord]] = [[] for _ in range(num_towers)]
        self.reference: List[int] = []  # which tower first made call k
        self.keys: List[int] = []       # call k -> its key


class CallLedger:
    """Per tower, the forward and backward calls in creation order.

    Args:
      num_towers: the towers that must make the same calls.
      new_key: returns a fresh key for each newly seen call index (an
        instance key, unique in the graph).
    """

    def __init__(self, num_towers: int, new_key: Callable[[], int]):
        self._new_key = new_key
        self._lock = threading.Lock()
        self._directions = {"forward": _Direction(num_towers),
                            "backward": _Direction(num_towers)}

    def num_calls(self, tower_index: int, direction: str = "forward") -> int:
        return len(self._directions[direction].calls[tower_index])

    def record(self, direction: str, tower_index: int, record: CallRecord) -> int:
        """Appends `record` to the tower's calls; returns the call's key.

        Compares it with the same call of the tower that made it first and
        raises CollectiveMismatchError at once if they differ.
        """
        calls = self._directions[direction]
        with self._lock:
            index = len(calls.calls[tower_index])
            if index < len(calls.reference):
                ref_tower = calls.reference[index]
                ref = calls.calls[ref_tower][index]
                if record.conflicts_with(ref):
                    raise CollectiveMismatchError(
                        f"Cross-tower {direction} reduction #{index} differs between "
                        f"towers: tower {ref_tower} made {ref.describe()} but tower "
                        f"{tower_index} made {record.describe()}. They would be "
                        "paired and fail or wait forever. Every tower must "
                        "call the synchronized layers in the same order with the same "
                        "shapes (same layers, same channels)."
                    )
            else:
                calls.reference.append(tower_index)
                calls.keys.append(self._new_key())
            calls.calls[tower_index].append(record)
            return calls.keys[index]

    def check_counts(self, direction: str) -> None:
        """Raises CollectiveMismatchError unless every tower made as many calls."""
        calls = self._directions[direction].calls
        counts = [len(c) for c in calls]
        if len(set(counts)) <= 1:
            return
        fewest, most = min(counts), max(counts)
        short_tower = counts.index(fewest)
        long_tower = counts.index(most)
        first_missing = calls[long_tower][fewest]
        raise CollectiveMismatchError(
            f"Towers made different numbers of {direction} cross-tower "
            "reductions: "
            + ", ".join(f"tower {t}: {n}" for t, n in enumerate(counts))
            + f". Tower {short_tower} never made reduction #{fewest} "
            f"({first_missing.describe()}, made by tower {long_tower}), so that "
            "reduction could never complete (a collective would wait for it until a "
            "deadline). Every tower must "
            "call the synchronized layers (e.g. batch_norm with "
            "bn_mode='sync') the same number of times in the same order; do not "
            "make them depend on ctx.index or ctx.is_first."
        )

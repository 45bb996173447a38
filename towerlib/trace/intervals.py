"""Integer time intervals: unions, lengths and a sweep over overlapping sets.

Everything here works on half-open intervals [start, end) of integer
microseconds, as (start, end) tuples. An op that ran for less than a
microsecond has start == end and covers no time: it counts as an op, not
as time. No floats are involved, so the totals the analysis reports are
exact and add up exactly.

    union([(0, 10), (5, 20), (30, 40)])   -> [(0, 20), (30, 40)]
    length([(0, 20), (30, 40)])           -> 30
    coverage_counts({"a": [(0, 10)], "b": [(5, 20)]})
        -> [(0, 5, {"a"}), (5, 10, {"a", "b"}), (10, 20, {"b"})]
"""

from typing import Dict, Hashable, Iterable, List, Mapping, Sequence, Tuple

Interval = Tuple[int, int]


def union(intervals: Iterable[Interval]) -> List[Interval]:
    """The union of `intervals` as sorted, disjoint, non-touching intervals.

    Empty intervals (start >= end) are dropped; touching ones ([0, 5) and
    [5, 9)) merge into one.
    """
    merged: List[List[int]] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(start, end) for start, end in merged]


def length(intervals: Iterable[Interval]) -> int:
    """The time covered by `intervals` (overlaps counted once)."""
    return sum(end - start for start, end in union(intervals))


def coverage_counts(sets: Mapping[Hashable, Sequence[Interval]]
                    ) -> List[Tuple[int, int, frozenset]]:
    """The time line cut where any interval starts or ends.

    Args:
      sets: {key: intervals}, e.g. {tower index: that tower's op intervals}.

    Returns:
      [(start, end, keys active throughout [start, end))] for every piece of
      time during which at least one key is active, in time order. The
      pieces are disjoint and together cover exactly the union of all sets.
    """
    events: Dict[int, List[Tuple[int, Hashable]]] = {}
    for key, intervals in sets.items():
        for start, end in union(intervals):
            events.setdefault(start, []).append((+1, key))
            events.setdefault(end, []).append((-1, key))
    active: Dict[Hashable, int] = {}
    pieces = []
    times = sorted(events)
    for here, following in zip(times, times[1:] + [None]):
        for change, key in events[here]:
            active[key] = active.get(key, 0) + change
            if not active[key]:
                del active[key]
        if following is not None and active:
            pieces.append((here, following, frozenset(active)))
    return pieces


def partition(sets: Mapping[Hashable, Sequence[Interval]],
              priority: Sequence[Hashable]) -> Dict[Hashable, int]:
    """Each key's time when the time line goes to the highest-priority active key.

    Args:
      sets: {key: intervals}; every key must appear in `priority`.
      priority: the keys, highest priority first.

    Returns:
      {key: microseconds} for every key of `priority` (0 when it never
      wins). The values add up to length(all intervals of all keys) exactly.
    """
    rank = {key: position for position, key in enumerate(priority)}
    unknown = set(sets) - set(rank)
    if unknown:
        raise ValueError(f"keys {sorted(map(str, unknown))} have no priority")
    totals = {key: 0 for key in priority}
    for start, end, active in coverage_counts(sets):
        totals[min(active, key=rank.__getitem__)] += end - start
    return totals

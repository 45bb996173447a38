"""Collective group and instance keys, unique within one graph.

Collective ops pair up at run time by key: every member of a group shares a
group key, and the members of one call share an instance key. Two reducers in
one graph must never share a key, or they would pair each other's ops.

Keys start far from 0 so that towerlib's collectives do not collide with
other users of collective ops in the same graph (tf.distribute starts at 1),
and group keys stay in a range of their own so that a graph imported from a
MetaGraphDef still shows which collectives are towerlib's.
"""

import threading
import weakref

import tensorflow as tf

__all__ = ["KeyAllocator", "allocator_for", "is_towerlib_group_key"]

_GROUP_KEY_BASE = 0x7A0000
_INSTANCE_KEY_BASE = 0x7A0000
_GROUP_KEY_END = _GROUP_KEY_BASE + 0x10000


class KeyAllocator:
    """Group and instance keys for the collectives of one graph.

    A new graph starts from the same keys as the last one: no counter leaks
    from one graph into the next.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._next_group_key = _GROUP_KEY_BASE
        self._next_instance_key = _INSTANCE_KEY_BASE
        self.used_group_keys = set()

    def new_group_key(self) -> int:
        with self._lock:
            while self._next_group_key in self.used_group_keys:
                self._next_group_key += 1
            key = self._next_group_key
            self.used_group_keys.add(key)
            self._next_group_key += 1
            return key

    def claim_group_key(self, key: int) -> None:
        with self._lock:
            if key in self.used_group_keys:
                raise ValueError(
                    f"group_key {key} is already used by another CrossTowerReducer in "
                    "this graph. Two reducers with one group key would pair each "
                    "other's collectives; pass group_key=None to get a fresh key."
                )
            self.used_group_keys.add(key)

    def new_instance_key(self) -> int:
        with self._lock:
            key = self._next_instance_key
            self._next_instance_key += 1
            return key


# Keys must be unique per graph, whoever builds in it, so the allocator hangs
# off the graph object, held weakly: it lives exactly as long as its graph. A
# graph collection would also work, but Saver.export_meta_graph tries to
# serialize every collection and warns about ones it cannot.
_ALLOCATORS = weakref.WeakKeyDictionary()
_ALLOCATORS_LOCK = threading.Lock()


def allocator_for(graph: tf.Graph) -> KeyAllocator:
    """The one KeyAllocator of `graph`, created on first use."""
    with _ALLOCATORS_LOCK:
        allocator = _ALLOCATORS.get(graph)
        if allocator is None:
            allocator = KeyAllocator()
            _ALLOCATORS[graph] = allocator
        return allocator


def is_towerlib_group_key(graph: tf.Graph, key: int) -> bool:
    """Whether collective group `key` in `graph` belongs to a towerlib reducer.

    True for the keys this graph's reducers were given (a claimed key may lie
    anywhere) and, for a graph imported from a MetaGraphDef (its allocator is
    gone), for keys in the range towerlib allocates from.
    """
    with _ALLOCATORS_LOCK:
        allocator = _ALLOCATORS.get(graph)
    if allocator is not None and key in allocator.used_group_keys:
        return True
    return _GROUP_KEY_BASE <= key < _GROUP_KEY_END

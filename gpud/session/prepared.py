"""A session's prepared dispatches: checked and packed once, reused while the same dispatch repeats.

Keyed by the dispatch's fields after its seq (kernel, grid, arguments, writes): a step that repeats
with stable handles (views are their base's handle with a shape) hits on every dispatch. Bounded:
when full, the least recently used entry goes, one at a time. An entry goes too when a tensor
handle it uses is freed, since a later tensor may get that handle.
"""

from __future__ import annotations

from typing import Any

from gpud_protocol.lru import LruCache

Key = tuple[Any, ...]
Entry = tuple[Any, Any, tuple[int, ...]]  # (what the runtime dispatches, the runtime, tensor handles used)

CAPACITY = 4096


class PreparedDispatches(LruCache[Key, Entry]):
    def __init__(self, capacity: int = CAPACITY) -> None:
        super().__init__(capacity, self._unindex)
        self._by_handle: dict[int, dict[Key, None]] = {}  # handle -> the keys that use it (an ordered set)

    def add(self, key: Key, prepared: Any, runtime: Any, handles: tuple[int, ...]) -> None:
        self.put(key, (prepared, runtime, handles))
        for handle in handles:
            self._by_handle.setdefault(handle, {})[key] = None

    def forget(self, handle: int) -> None:
        """Drop every entry that uses tensor handle `handle`."""
        for key in list(self._by_handle.get(handle, ())):
            entry = self.pop(key)
            if entry is not None:
                self._unindex(key, entry)

    def handles_indexed(self) -> int:
        """How many handles the index knows (tests check it does not outgrow the entries)."""
        return len(self._by_handle)

    def _unindex(self, key: Key, entry: Entry) -> None:
        for handle in entry[2]:
            keys = self._by_handle.get(handle)
            if keys is not None:
                keys.pop(key, None)
                if not keys:
                    del self._by_handle[handle]

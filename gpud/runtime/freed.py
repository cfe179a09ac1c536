"""Freed device memory kept for reuse, keyed by exact size and bounded in bytes.

A buffer reaches here only once every submission that used it has completed, so its next owner
may be handed it at once. Where the device frees synchronously (cuMemFree waits for the whole GPU)
this turns a step that allocates and frees scratch into one that never frees at all.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any


class FreedMemory:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.nbytes = 0
        self.hits = 0
        self.misses = 0
        self._by_size: OrderedDict[int, list[Any]] = OrderedDict()  # least recently freed size first

    def take(self, nbytes: int) -> Any | None:
        """A kept allocation of exactly `nbytes`, or None."""
        natives = self._by_size.get(nbytes)
        if not natives:
            self.misses += 1
            return None
        native = natives.pop()
        if not natives:
            del self._by_size[nbytes]
        self.nbytes -= nbytes
        self.hits += 1
        return native

    def keep(self, nbytes: int, native: Any) -> list[Any]:
        """Keep `native`; the allocations (perhaps it) that no longer fit, for the caller to free."""
        if nbytes > self.max_bytes:
            return [native]
        self._by_size.setdefault(nbytes, []).append(native)
        self._by_size.move_to_end(nbytes)
        self.nbytes += nbytes
        evicted: list[Any] = []
        while self.nbytes > self.max_bytes:
            size, natives = next(iter(self._by_size.items()))
            evicted.append(natives.pop(0))
            self.nbytes -= size
            if not natives:
                del self._by_size[size]
        return evicted

    def clear(self) -> list[Any]:
        """Everything kept, for the caller to free."""
        natives = [n for natives in self._by_size.values() for n in natives]
        self._by_size.clear()
        self.nbytes = 0
        return natives

    def stats(self) -> dict[str, int]:
        return {"bytes": self.nbytes, "hits": self.hits, "misses": self.misses}

"""Freed device memory kept for reuse, keyed by exact size and bounded in bytes.

A buffer reaches here only once every submission that used it has completed, so its next owner
may be handed it at once. Where the device frees synchronously (cuMemFree waits for the whole GPU)
this turns a step that allocates and frees scratch into one that never frees at all. Memory kept
idle for a while goes back to the device (`release_idle`, from the runtime's periodic tick).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any


class FreedMemory:
    def __init__(self, max_bytes: int, clock: Callable[[], float] | None = None) -> None:
        self.max_bytes = max_bytes
        self._clock = clock or time.monotonic
        self.nbytes = 0
        self.hits = 0
        self.misses = 0
        # (allocation, when it was kept) by size, oldest first; the least recently freed size first
        self._by_size: OrderedDict[int, list[tuple[Any, float]]] = OrderedDict()
        self.released = 0

    def take(self, nbytes: int) -> Any | None:
        """A kept allocation of exactly `nbytes`, or None."""
        natives = self._by_size.get(nbytes)
        if not natives:
            self.misses += 1
            return None
        native = natives.pop()[0]
        if not natives:
            del self._by_size[nbytes]
        self.nbytes -= nbytes
        self.hits += 1
        return native

    def keep(self, nbytes: int, native: Any) -> list[Any]:
        """Keep `native`; the allocations (perhaps it) that no longer fit, for the caller to free."""
        if nbytes > self.max_bytes:
            return [native]
        self._by_size.setdefault(nbytes, []).append((native, self._clock()))
        self._by_size.move_to_end(nbytes)
        self.nbytes += nbytes
        evicted: list[Any] = []
        while self.nbytes > self.max_bytes:
            size, natives = next(iter(self._by_size.items()))
            evicted.append(natives.pop(0)[0])
            self.nbytes -= size
            if not natives:
                del self._by_size[size]
        return evicted

    def clear(self) -> list[Any]:
        """Everything kept, for the caller to free."""
        natives = [n for natives in self._by_size.values() for n, _kept in natives]
        self._by_size.clear()
        self.nbytes = 0
        return natives

    def release_idle(self, idle_s: float, most: int) -> list[Any]:
        """Up to `most` allocations kept for `idle_s` or longer, the oldest first, for the caller to free."""
        cutoff = self._clock() - idle_s
        released: list[Any] = []
        while len(released) < most:
            oldest = min(
                ((natives[0][1], size) for size, natives in self._by_size.items() if natives[0][1] <= cutoff),
                default=None,
            )
            if oldest is None:
                break
            size = oldest[1]
            natives = self._by_size[size]
            released.append(natives.pop(0)[0])
            self.nbytes -= size
            if not natives:
                del self._by_size[size]
        self.released += len(released)
        return released

    def stats(self) -> dict[str, int]:
        return {"bytes": self.nbytes, "hits": self.hits, "misses": self.misses, "released": self.released}

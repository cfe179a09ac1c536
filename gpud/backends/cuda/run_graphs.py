"""Which CUDA graph serves a run of launches (`GraphRunner.issue`): graphs keyed by the run's shape (each
launch's kernel, grid and block) and its argument bytes, at most `capacity`, the least recently used
evicted one at a time.

A shape seen for the second time gets a graph. A run of a known shape with other arguments patches the
shape's latest graph, which then holds that run's arguments (a new scalar every step patches those
nodes, nothing else). Arguments that come back after their graph was patched away (sessions taking turns
with their own buffers) get a graph of their own the second time, launched from then on unpatched.
Callers hold `GraphRunner.lock`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

from gpud_protocol.lru import LruCache

G = TypeVar("G")
Key = tuple[Any, ...]  # (shape, arguments)


class RunGraphs(Generic[G]):
    def __init__(self, capacity: int, evicted: Callable[[Key, G], None]) -> None:
        self._evicted = evicted
        self.graphs: LruCache[Key, G] = LruCache(capacity, self._on_evict)
        self._seen: LruCache[Key, int] = LruCache(2 * capacity)  # shapes without a graph
        self._again: LruCache[Key, int] = LruCache(2 * capacity)  # arguments whose graph was patched away
        self._latest: dict[Key, Key] = {}  # shape -> the key of its latest graph

    def find(self, shape: Key, key: Key) -> tuple[G | None, bool, bool]:
        """(graph, patch, build) for a run: its own graph (patch False); the shape's latest graph, to patch
        to this run's arguments (patch True: it is kept under this run's key from now); or none, and
        whether to build one (`keep` it once built)."""
        graph = self.graphs.get(key)
        if graph is not None:
            return graph, False, False
        again = (self._again.get(key) or 0) + 1
        latest = self._latest.get(shape)
        near = None if latest is None else self.graphs.pop(latest)
        if near is not None and latest is not None:
            if again < 2:
                self._again.put(key, again)
                self.graphs.put(key, near)
                self._latest[shape] = key
                return near, True, False
            self.graphs.put(latest, near)  # it keeps its own arguments; this run gets a graph of its own
            self._again.pop(key)
            return None, False, True
        seen = (self._seen.get(shape) or 0) + 1
        if seen >= 2:
            self._seen.pop(shape)
            self._again.pop(key)
            return None, False, True
        self._seen.put(shape, seen)
        return None, False, False

    def keep(self, shape: Key, key: Key, graph: G) -> None:
        self.graphs.put(key, graph)  # may evict another
        self._latest[shape] = key

    def clear(self) -> None:
        """Drop every graph (each to `evicted`) and every run seen."""
        self.graphs.clear()
        self._seen.clear()
        self._again.clear()
        self._latest.clear()

    def _on_evict(self, key: Key, graph: G) -> None:
        if self._latest.get(key[0]) == key:
            del self._latest[key[0]]
        self._evicted(key, graph)

"""A bounded LRU cache: when full, a put evicts the least recently used entry, one at a time (never the
whole cache: a steady workload must not turn into periodic storms of misses). Keys are tuples of exact
identities, never joined strings. The one definition, for the client, the codec and the daemon."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LruCache(Generic[K, V]):
    """`get` returns None for a missing key, so values are never None."""

    def __init__(self, capacity: int, on_evict: Callable[[K, V], None] | None = None) -> None:
        if capacity < 1:
            raise ValueError("cache capacity must be at least 1")
        self.capacity = capacity
        self._on_evict = on_evict
        self._items: OrderedDict[K, V] = OrderedDict()
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    def get(self, key: K) -> V | None:
        items = self._items
        value = items.get(key)
        if value is None:
            self.misses += 1
            return None
        self.hits += 1
        items.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        items = self._items
        items[key] = value
        items.move_to_end(key)
        while len(items) > self.capacity:
            old_key, old_value = items.popitem(last=False)
            self.evictions += 1
            if self._on_evict is not None:
                self._on_evict(old_key, old_value)

    def pop(self, key: K) -> V | None:
        """Remove `key` without calling `on_evict`."""
        return self._items.pop(key, None)

    def clear(self) -> None:
        """Empty the cache, calling `on_evict` for every entry (oldest first)."""
        while self._items:
            key, value = self._items.popitem(last=False)
            if self._on_evict is not None:
                self._on_evict(key, value)

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def stats(self) -> dict[str, int]:
        return {
            "size": len(self._items),
            "capacity": self.capacity,
            "hits": self.hits,
            "misses": self.misses,
            "evictions": self.evictions,
        }

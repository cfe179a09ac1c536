"""The bounded LRU cache of the daemon's caches: `gpud_protocol.lru.LruCache` (one definition, which the
client and the codec use too)."""

from __future__ import annotations

from gpud_protocol.lru import LruCache

__all__ = ["LruCache"]

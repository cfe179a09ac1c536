"""Unit tests of the bounded LRU cache and the exact kernel-cache key."""

from __future__ import annotations

import pytest

from gpud.backends.base import program_key as kernel_key
from gpud.runtime.cache import LruCache
from gpud_protocol import KernelOptions


def test_evicts_least_recently_used_in_order() -> None:
    evicted: list[tuple[str, int]] = []
    cache: LruCache[str, int] = LruCache(3, lambda k, v: evicted.append((k, v)))
    for i, key in enumerate("abc"):
        cache.put(key, i)
    assert cache.get("a") == 0  # a is now the most recent: b is the oldest
    cache.put("d", 3)
    assert evicted == [("b", 1)]
    cache.put("e", 4)
    assert evicted == [("b", 1), ("c", 2)]
    assert "a" in cache and "d" in cache and "e" in cache
    assert "b" not in cache and "c" not in cache
    assert len(cache) == 3


def test_put_of_an_existing_key_refreshes_without_evicting() -> None:
    evicted: list[str] = []
    cache: LruCache[str, int] = LruCache(2, lambda k, _v: evicted.append(k))
    cache.put("a", 1)
    cache.put("b", 2)
    cache.put("a", 10)  # replaces and refreshes a
    assert evicted == []
    cache.put("c", 3)
    assert evicted == ["b"]
    assert cache.get("a") == 10


def test_never_holds_more_than_capacity() -> None:
    evicted: list[int] = []
    cache: LruCache[int, int] = LruCache(5, lambda k, _v: evicted.append(k))
    for i in range(100):
        cache.put(i, i)
        assert len(cache) <= 5
    assert evicted == list(range(95))
    assert [k for k in range(100) if k in cache] == [95, 96, 97, 98, 99]


def test_exact_tuple_keys() -> None:
    """("a:2", 1) and ("a", 2) must never meet, as a joined string key would make them."""
    cache: LruCache[tuple[object, ...], str] = LruCache(8)
    cache.put(("a:2", 1), "first")
    cache.put(("a", 2), "second")
    cache.put(("a", "2"), "third")
    cache.put(("a", 2, 1), "fourth")
    assert cache.get(("a:2", 1)) == "first"
    assert cache.get(("a", 2)) == "second"
    assert cache.get(("a", "2")) == "third"
    assert cache.get(("a", 2, 1)) == "fourth"
    assert cache.get(("a:2:1",)) is None
    assert len(cache) == 4


def test_pop_and_clear() -> None:
    evicted: list[str] = []
    cache: LruCache[str, int] = LruCache(4, lambda k, _v: evicted.append(k))
    for i, key in enumerate("abc"):
        cache.put(key, i)
    assert cache.pop("b") == 1  # an explicit pop is the caller's business: no callback
    assert cache.pop("b") is None
    assert evicted == []
    cache.get("a")
    cache.clear()  # clear hands every value to the callback, oldest first
    assert evicted == ["c", "a"]
    assert len(cache) == 0


def test_hit_and_miss_counters() -> None:
    cache: LruCache[str, int] = LruCache(2)
    cache.put("a", 1)
    cache.get("a")
    cache.get("a")
    cache.get("zz")
    assert cache.stats() == {"size": 1, "capacity": 2, "hits": 2, "misses": 1, "evictions": 0}
    cache.put("b", 2)
    cache.put("c", 3)  # evicts "a"
    assert cache.stats()["evictions"] == 1


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError):
        LruCache(0)


def test_kernel_key_keeps_every_identity_apart() -> None:
    plain = KernelOptions(None, (), None)
    keys = {
        kernel_key("src", "main", plain),
        kernel_key("src", "main2", plain),
        kernel_key("src2", "main", plain),
        kernel_key("src", "main", KernelOptions((64, 1, 1), (), None)),
        kernel_key("src", "main", KernelOptions(None, ("-O3",), None)),
        kernel_key("src", "main", KernelOptions(None, ("-O3", "-g"), None)),
        kernel_key("src", "main", KernelOptions(None, ("-O3 -g",), None)),
        kernel_key("src", "main", KernelOptions(None, (), (1,))),
        kernel_key("src", "main", KernelOptions(None, (), ())),
        kernel_key("a:2", "main", plain),
        kernel_key("a", "2:main", plain),
    }
    assert len(keys) == 11
    assert kernel_key("src", "main", plain) == kernel_key("src", "main", KernelOptions(None, (), None))

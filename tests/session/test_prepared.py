"""A session's prepared dispatches: bounded, the least recently used evicted one at a time, and the
entries of a freed handle dropped without leaving their keys behind in the index (no daemon)."""

from __future__ import annotations

from gpud.session.prepared import PreparedDispatches


def key(n: int) -> tuple[int, ...]:
    return (n,)


def test_a_full_cache_evicts_its_least_recent_entry_only() -> None:
    """Regression: the cache was cleared wholesale when full: every dispatch of a steady step missed."""
    cache = PreparedDispatches(capacity=3)
    for n in range(3):
        cache.add(key(n), f"p{n}", "rt", (10 + n,))
    assert cache.get(key(0)) == ("p0", "rt", (10,))  # now the most recent
    cache.add(key(3), "p3", "rt", (13,))
    assert len(cache) == 3 and cache.evictions == 1
    assert key(1) not in cache and all(key(n) in cache for n in (0, 2, 3))
    assert cache.handles_indexed() == 3  # handle 11 left the index with its entry


def test_forgetting_a_handle_drops_its_entries_and_their_index() -> None:
    cache = PreparedDispatches(capacity=100)
    cache.add(key(0), "p0", "rt", (1, 2))
    cache.add(key(1), "p1", "rt", (2, 3))
    cache.add(key(2), "p2", "rt", (4,))
    cache.forget(2)
    assert key(0) not in cache and key(1) not in cache and key(2) in cache
    assert cache.handles_indexed() == 1  # handles 1 and 3 are not left pointing at dropped keys
    cache.forget(99)  # unknown: nothing
    assert len(cache) == 1


def test_a_long_lived_handle_with_churning_partners_does_not_grow_the_index() -> None:
    cache = PreparedDispatches(capacity=4)
    for n in range(1000):  # handle 1 stays, each step with a new partner that is then freed
        cache.add(key(n), "p", "rt", (1, 1000 + n))
        cache.forget(1000 + n)
    assert len(cache) == 0 and cache.handles_indexed() == 0
    for n in range(1000):  # never freed: bounded by the capacity
        cache.add(key(n), "p", "rt", (1, 1000 + n))
    assert len(cache) == 4 and cache.handles_indexed() == 5

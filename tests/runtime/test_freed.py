"""Freed memory kept for reuse: exact sizes, the byte bound, the oldest size evicted first."""

from __future__ import annotations

from gpud.runtime.freed import FreedMemory


def test_exact_sizes_are_handed_back_most_recent_first() -> None:
    kept = FreedMemory(100)
    assert kept.keep(10, "a") == [] and kept.keep(10, "b") == [] and kept.keep(20, "c") == []
    assert kept.take(10) == "b" and kept.take(10) == "a" and kept.take(10) is None
    assert kept.take(30) is None and kept.nbytes == 20
    assert kept.stats() == {"bytes": 20, "hits": 2, "misses": 2, "released": 0}


def test_the_bound_evicts_the_least_recently_freed_size() -> None:
    kept = FreedMemory(50)
    kept.keep(20, "a")
    kept.keep(10, "b")
    kept.keep(20, "c")  # size 20 is now the most recently freed
    assert kept.nbytes == 50
    assert kept.keep(10, "d") == ["a"]  # now size 20 is the least recent: its oldest goes
    assert kept.keep(10, "e") == [] and kept.nbytes == 50
    assert kept.keep(60, "big") == ["big"]  # larger than the bound: never kept
    assert sorted(kept.clear()) == ["b", "c", "d", "e"] and kept.nbytes == 0


def test_nothing_is_kept_with_a_bound_of_zero() -> None:
    kept = FreedMemory(0)
    assert kept.keep(8, "a") == ["a"] and kept.take(8) is None


def test_memory_kept_idle_is_released_oldest_first_a_few_at_a_time() -> None:
    clock = [0.0]
    kept = FreedMemory(100, clock=lambda: clock[0])
    kept.keep(10, "a")
    clock[0] = 5.0
    kept.keep(20, "b")
    clock[0] = 6.0
    kept.keep(10, "c")
    clock[0] = 29.0
    assert kept.release_idle(30.0, 8) == []  # nothing idle for 30 s yet
    clock[0] = 34.0
    assert kept.release_idle(30.0, 8) == ["a"] and kept.nbytes == 30
    clock[0] = 40.0
    assert kept.release_idle(30.0, 1) == ["b"]  # one at a time when asked: the oldest first
    assert kept.take(10) == "c"  # what was reused meanwhile is not released
    assert kept.release_idle(30.0, 8) == [] and kept.nbytes == 0
    assert kept.stats()["released"] == 2

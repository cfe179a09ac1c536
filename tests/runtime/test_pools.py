"""Unit tests of the bounded staging pool (DESIGN ordering rule 4), plus one daemon-level check."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import random
import tempfile
from pathlib import Path

import anyio
import numpy as np
import pytest

import gpud_client
from gpud.runtime.pools import StagingPool, size_class
from gpud.testing import spawn

_ids = itertools.count(1)


@dataclasses.dataclass(eq=False)
class FakeBuffer:
    size: int
    id: int = dataclasses.field(default_factory=lambda: next(_ids))
    destroyed: bool = False


class Harness:
    """A pool over fake buffers that checks the byte bound on every allocation."""

    def __init__(self, capacity: int, min_size: int = 4096) -> None:
        self.now = 0.0  # the pool's clock
        self.capacity = capacity
        self.live: set[FakeBuffer] = set()
        self.made: list[FakeBuffer] = []
        self.destroyed: list[FakeBuffer] = []
        self.flushes = 0
        self.on_flush: list[FakeBuffer] = []  # buffers "completed" by the next flush
        self.pool: StagingPool[FakeBuffer] = StagingPool(
            self.make, self.destroy, capacity, self.flush, min_size, clock=lambda: self.now
        )

    @property
    def live_bytes(self) -> int:
        return sum(b.size for b in self.live)

    def make(self, size: int) -> FakeBuffer:
        buffer = FakeBuffer(size)
        self.live.add(buffer)
        self.made.append(buffer)
        assert self.live_bytes <= self.capacity, f"pool grew to {self.live_bytes} bytes past {self.capacity}"
        return buffer

    def destroy(self, buffer: FakeBuffer) -> None:
        assert not buffer.destroyed
        buffer.destroyed = True
        self.live.remove(buffer)
        self.destroyed.append(buffer)

    def flush(self) -> None:
        self.flushes += 1


def test_size_classes() -> None:
    assert size_class(1, 4096) == 4096
    assert size_class(4096, 4096) == 4096
    assert size_class(4097, 4096) == 8192
    assert size_class(0, 4096) == 4096
    assert size_class(5, 4) == 8
    assert size_class(1 << 20, 4096) == 1 << 20


async def test_reuses_returned_buffers() -> None:
    h = Harness(64 << 10)
    first, size = await h.pool.acquire(100)
    assert size == 4096 and first.size == 4096
    h.pool.give_back(first, size)
    again, _ = await h.pool.acquire(4000)
    assert again is first
    assert len(h.made) == 1
    expected = {"bytes": 4096, "in_use": 1, "idle": 0, "hits": 1, "misses": 1, "exhausted_waits": 0, "released": 0}
    assert h.pool.stats() == expected


async def test_request_larger_than_the_bound_is_refused() -> None:
    h = Harness(16 << 10)
    with pytest.raises(ValueError):
        await h.pool.acquire((16 << 10) + 1)
    assert h.made == []
    assert h.pool.largest_class() <= h.capacity


async def test_exhaustion_flushes_and_waits_for_give_back() -> None:
    h = Harness(8192)
    a, sa = await h.pool.acquire(4096)
    b, sb = await h.pool.acquire(4096)
    assert h.flushes == 0
    waiter = asyncio.ensure_future(h.pool.acquire(4096))
    for _ in range(5):
        await asyncio.sleep(0)
    assert not waiter.done(), "an exhausted pool must wait, not grow"
    assert h.flushes == 1, "an exhausted pool flushes pending work so its buffers can come back"
    assert h.pool.exhausted_waits == 1
    assert len(h.made) == 2
    h.pool.give_back(b, sb)
    with anyio.fail_after(2):
        got, size = await waiter
    assert got is b and size == 4096
    assert len(h.made) == 2 and h.live_bytes == 8192
    h.pool.give_back(a, sa)
    h.pool.give_back(got, size)
    assert h.pool.stats()["in_use"] == 0


async def test_idle_buffers_of_other_sizes_are_dropped_first() -> None:
    h = Harness(16384)
    big = [await h.pool.acquire(8192) for _ in range(2)]
    for buffer, size in big:
        h.pool.give_back(buffer, size)
    assert h.live_bytes == 16384
    _small, size = await h.pool.acquire(100)
    assert size == 4096
    assert h.flushes == 0 and h.pool.exhausted_waits == 0, "idle buffers are dropped before anyone waits"
    assert [b.size for b in h.destroyed] == [8192]
    assert h.live_bytes == 8192 + 4096 <= h.capacity
    # The remaining idle 8192 buffer is still reused for its own size.
    again, _ = await h.pool.acquire(8000)
    assert again is big[1][0] or again is big[0][0]
    assert not again.destroyed


async def test_idle_buffers_of_the_same_size_are_reused_not_dropped() -> None:
    h = Harness(8192)
    a = await h.pool.acquire(4096)
    b = await h.pool.acquire(4096)
    h.pool.give_back(*a)
    c = await h.pool.acquire(4096)
    assert c[0] is a[0]
    assert h.destroyed == []
    h.pool.give_back(*b)
    h.pool.give_back(*c)


async def test_discard_destroys_and_wakes_a_waiter() -> None:
    h = Harness(8192)
    a, sa = await h.pool.acquire(8192)
    waiter = asyncio.ensure_future(h.pool.acquire(4096))
    await asyncio.sleep(0)
    assert not waiter.done()
    h.pool.discard(a, sa)  # e.g. a failed map: its state is unknown, it must not be reused
    assert a.destroyed
    with anyio.fail_after(2):
        got, size = await waiter
    assert got is not a and size == 4096
    expected = {"bytes": 4096, "in_use": 1, "idle": 0, "hits": 0, "misses": 2, "exhausted_waits": 1, "released": 0}
    assert h.pool.stats() == expected


async def test_clear_idle_keeps_buffers_in_use() -> None:
    h = Harness(32768)
    held = await h.pool.acquire(4096)
    for size in (4096, 8192, 16384):
        h.pool.give_back(*(await h.pool.acquire(size)))
    h.pool.clear_idle()
    assert h.live == {held[0]}
    expected = {"bytes": 4096, "in_use": 1, "idle": 0, "hits": 0, "misses": 4, "exhausted_waits": 0, "released": 0}
    assert h.pool.stats() == expected


async def test_buffers_idle_for_a_while_are_released_the_longest_idle_first() -> None:
    """Regression: after a burst (a model's batch on lavapipe) the pools held 128 MiB idle for good."""
    h = Harness(1 << 20)
    burst = [await h.pool.acquire(size) for size in (4096, 4096, 8192, 65536)]
    for buffer, size in burst:
        h.pool.give_back(buffer, size)
        h.now += 1.0  # given back at 0, 1, 2 and 3 s
    steady = await h.pool.acquire(4096)  # a steady workload reuses the buffer returned last
    h.now = 29.5
    assert h.pool.release_idle(30.0, 8) == 0
    h.now = 32.5  # two of the idle ones have been idle for 30 s (the one in use is not idle at all)
    assert h.pool.release_idle(30.0, 1) == 1 and h.destroyed == [burst[0][0]]  # one at a time when asked
    assert h.pool.release_idle(30.0, 8) == 1 and h.destroyed == [burst[0][0], burst[2][0]]
    h.now = 100.0
    assert h.pool.release_idle(30.0, 8) == 1 and h.live == {steady[0]}
    assert h.pool.stats()["bytes"] == 4096 and h.pool.stats()["released"] == 3
    h.pool.give_back(*steady)
    assert (await h.pool.acquire(4096))[0] is steady[0]  # what is kept is still reused


async def test_two_waiters_both_get_a_buffer() -> None:
    """Two tasks waiting on an exhausted pool: each give_back must be able to wake either one."""
    h = Harness(8192)
    a = await h.pool.acquire(4096)
    b = await h.pool.acquire(4096)
    first = asyncio.ensure_future(h.pool.acquire(4096))
    await asyncio.sleep(0)
    second = asyncio.ensure_future(h.pool.acquire(4096))
    await asyncio.sleep(0)
    h.pool.give_back(*a)
    await asyncio.sleep(0.01)
    h.pool.give_back(*b)
    with anyio.fail_after(2):
        results = await asyncio.gather(first, second)
    assert {r[0].id for r in results} == {a[0].id, b[0].id}


async def test_random_workload_never_exceeds_the_bound() -> None:
    """Random sizes, completions only on flush: the pool stays within its bound and never deadlocks."""
    rng = random.Random(7)
    h = Harness(64 << 10)
    pending: list[tuple[FakeBuffer, int]] = []  # handed to the "command buffer", not yet completed

    def flush() -> None:
        h.flushes += 1
        done, pending[:] = list(pending), []
        loop = asyncio.get_running_loop()
        for buffer, size in done:  # completions arrive later, on the loop
            loop.call_soon(h.pool.give_back, buffer, size)

    h.pool._flush = flush
    with anyio.fail_after(10):
        for _ in range(2000):
            buffer, size = await h.pool.acquire(rng.choice([1, 100, 4096, 5000, 9000, 16384, 30000]))
            assert buffer.size == size and not buffer.destroyed
            pending.append((buffer, size))
            assert h.live_bytes <= h.capacity
            if rng.random() < 0.05:
                flush()
    assert h.pool.exhausted_waits > 0  # the bound was actually reached
    assert h.pool.bytes_total == h.live_bytes


async def test_daemon_with_a_tiny_staging_pool_recycles_instead_of_growing() -> None:
    """End to end: 8 MiB through a 1 MiB staging pool (chunked, flushed and recycled), both ways."""
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "gpud.toml"
        config.write_text("[gpud]\nstaging_pool_bytes = 1048576\n")
        with spawn.daemon("webgpu", extra_args=("--config", str(config))) as (address, proc):
            async with gpud_client.connect(address) as gpu:
                data = np.random.default_rng(3).integers(0, 256, 8 << 20, dtype=np.uint8)
                t = gpu.tensor(data)
                out = await t.numpy()
                np.testing.assert_array_equal(out, data)
                stats = (await gpu.stats())["device"]
                for pool in ("upload_staging", "download_staging"):
                    assert stats[pool]["bytes"] <= 512 << 10
                    assert stats[pool]["exhausted_waits"] > 0
            assert proc.poll() is None

"""Bounded staging pools, one pair per device (uploads and downloads).

A staging buffer leaves the pool on `acquire` and comes back through `give_back`, which the
backend calls only once the work that used it has completed (DESIGN ordering rule 4). At its
byte bound the pool first drops idle buffers of other sizes, then flushes pending work and waits
for one to come back: it never grows past the bound. A buffer left idle for a while is released
(`release_idle`, from the runtime's periodic tick): the pool shrinks back after a burst.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from typing import Generic, TypeVar

import anyio

T = TypeVar("T")


def size_class(nbytes: int, minimum: int) -> int:
    """Round up to a power of two, at least `minimum`."""
    return max(minimum, 1 << max(0, nbytes - 1).bit_length())


class StagingPool(Generic[T]):
    def __init__(
        self,
        make: Callable[[int], T],
        destroy: Callable[[T], None],
        capacity_bytes: int,
        flush: Callable[[], None],
        min_size: int = 4096,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._make = make
        self._destroy = destroy
        self._flush = flush
        self.capacity_bytes = capacity_bytes
        self.min_size = min_size
        self._clock = clock or time.monotonic
        # Idle buffers by size class with the time each came back, oldest first (reused last-in first-out).
        self._idle: defaultdict[int, list[tuple[T, float]]] = defaultdict(list)
        self._returned = anyio.Event()
        self.bytes_total = 0
        self.in_use = 0
        self.exhausted_waits = 0
        self.hits = 0  # requests served by an idle buffer
        self.misses = 0  # requests that made a new buffer
        self.returns = 0  # buffers given back or discarded so far
        self.released = 0  # idle buffers released after `release_idle`'s time

    def largest_class(self) -> int:
        """The biggest buffer a caller may ask for; larger transfers go in chunks of this size."""
        return 1 << (max(self.min_size, self.capacity_bytes // 4).bit_length() - 1)

    async def acquire(self, nbytes: int) -> tuple[T, int]:
        while True:
            since = self.returns
            if (got := self.try_acquire(nbytes)) is not None:
                return got
            await self.returned(since)

    def try_acquire(self, nbytes: int) -> tuple[T, int] | None:
        """A buffer of at least `nbytes` and its size class, or None when the pool is at its bound
        (then pending work has been flushed: wait for `returned()` and try again)."""
        size = size_class(nbytes, self.min_size)
        if size > self.capacity_bytes:
            raise ValueError(f"staging request of {nbytes} bytes exceeds the pool bound")
        if idle := self._idle[size]:
            self.in_use += 1
            self.hits += 1
            return idle.pop()[0], size
        if self.bytes_total + size <= self.capacity_bytes or self._drop_idle(size):
            buffer = self._make(size)
            self.misses += 1
            self.bytes_total += size
            self.in_use += 1
            return buffer, size
        self.exhausted_waits += 1
        self._flush()
        return None

    async def returned(self, since: int) -> None:
        """Wait until a buffer has come back to the pool since `returns` was `since`."""
        while self.returns == since:
            if self._returned.is_set():  # replacing an unset event would strand the tasks waiting on it
                self._returned = anyio.Event()
            await self._returned.wait()

    def give_back(self, buffer: T, size: int) -> None:
        self.in_use -= 1
        self._idle[size].append((buffer, self._clock()))
        self.returns += 1
        self._returned.set()

    def discard(self, buffer: T, size: int) -> None:
        """Destroy a buffer instead of returning it (its state is unknown, e.g. a failed map)."""
        self.in_use -= 1
        self.bytes_total -= size
        self._destroy(buffer)
        self.returns += 1
        self._returned.set()

    def _drop_idle(self, wanted: int) -> bool:
        """Destroy idle buffers of other sizes until `wanted` more bytes fit; True if they do."""
        for size, idle in self._idle.items():
            while idle and self.bytes_total + wanted > self.capacity_bytes:
                self._destroy(idle.pop(0)[0])
                self.bytes_total -= size
        return self.bytes_total + wanted <= self.capacity_bytes

    def clear_idle(self) -> None:
        self._drop_idle(self.capacity_bytes + 1)

    def release_idle(self, idle_s: float, most: int) -> int:
        """Destroy up to `most` buffers that have been idle for `idle_s` or longer, the longest idle
        first; how many. A steady workload reuses the buffers it returned last and keeps them."""
        cutoff = self._clock() - idle_s
        released = 0
        while released < most:
            oldest = min(
                ((idle[0][1], size) for size, idle in self._idle.items() if idle and idle[0][1] <= cutoff),
                default=None,
            )
            if oldest is None:
                break
            size = oldest[1]
            self._destroy(self._idle[size].pop(0)[0])
            self.bytes_total -= size
            released += 1
        self.released += released
        return released

    def stats(self) -> dict[str, int]:
        idle = sum(len(v) for v in self._idle.values())
        return {
            "bytes": self.bytes_total,
            "in_use": self.in_use,
            "idle": idle,
            "hits": self.hits,
            "misses": self.misses,
            "exhausted_waits": self.exhausted_waits,
            "released": self.released,
        }

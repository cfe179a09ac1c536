"""Memory kept for reuse goes back once nobody has used it for a while.

The staging pools and the reuse cache of freed device memory keep what a burst of work left behind
(a batch of a model on lavapipe: 128 MiB of staging, idle afterwards). A periodic tick of the
runtime releases what has been idle for `pool_idle_release_s`, a bounded number per tick, the
longest idle first: a steady workload keeps reusing the buffers it returned last and loses none.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, Protocol

PER_TICK = 256  # buffers each pool releases per tick at most (the frees queue on the submit worker); 8 was
# too few: random-size frees outpaced it and the reuse cache climbed towards its bound (the soak)


class Pool(Protocol):
    def release_idle(self, idle_s: float, most: int) -> int: ...


class Kept(Protocol):
    def release_idle(self, idle_s: float, most: int) -> list[Any]: ...


class IdleRelease:
    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        idle_s: float,
        pools: Sequence[Pool],
        kept: Kept,
        free: Callable[[list[Any]], None],
    ) -> None:
        self.idle_s = idle_s
        self.period_s = min(max(idle_s / 4, 0.05), 10.0)
        self._loop = loop
        self._pools = pools
        self._kept = kept
        self._free = free
        self._timer: asyncio.TimerHandle | None = None
        if idle_s > 0:
            self._timer = loop.call_later(self.period_s, self._tick)

    def release(self) -> int:
        """Release what has been idle long enough (at most PER_TICK per pool); how many."""
        released = sum(pool.release_idle(self.idle_s, PER_TICK) for pool in self._pools)
        natives = self._kept.release_idle(self.idle_s, PER_TICK)
        if natives:
            self._free(natives)
        return released + len(natives)

    def _tick(self) -> None:
        self.release()
        self._timer = self._loop.call_later(self.period_s, self._tick)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

"""Completion reports of a WebGPU device, released in submission order.

A submission's completion is seen through map waits (its download stagings, or a 4-byte fence),
and wgpu-native settles the map waits of different submissions in no promised order. The runtime
takes a report for submission N as "N and every earlier one are done" and then reads their
stagings: a report of N that overtook N - 1's would have N - 1's stagings read while their maps
are still pending ("Can only read from a buffer if its mapped", seen on a real GPU with several
clients reading back at once; lavapipe settles in order). So each report waits for the ones
before it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from gpud.backends.base import Done

_PENDING = object()


class OrderedReports:
    def __init__(self) -> None:
        self._queue: deque[list[object]] = deque()  # [done, outcome], oldest submission first

    def __len__(self) -> int:
        return len(self._queue)

    def add(self, done: Done) -> Callable[[BaseException | None], None]:
        """Queue the report of the next submission; returns what settles it."""
        entry: list[object] = [done, _PENDING]
        self._queue.append(entry)

        def settle(outcome: BaseException | None) -> None:
            if entry[1] is _PENDING:
                entry[1] = outcome
                self._release()

        return settle

    def _release(self) -> None:
        while self._queue and self._queue[0][1] is not _PENDING:
            done, outcome = self._queue.popleft()
            done(outcome)  # type: ignore[operator]

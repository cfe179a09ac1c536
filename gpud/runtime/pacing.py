"""How many dispatches one submission may hold: long work goes to the device in pieces.

Health is judged by progress (a device with work pending and nothing completing for
`health_stall_s` is unhealthy), so a submission must not run for anything near that long: work that
progresses has to be seen completing. The pacer times each submission on the device (the device
runs them in order, so one starts when it was submitted or when the one before it completed,
whichever is later) and adjusts how many dispatches the next ones may hold:

- a submission that took longer than `target_s`: cut the bound to what would have taken about
  `target_s` (one heavy submission is enough to shorten the next ones);
- one that held as many dispatches as allowed and took less than half of it: double the bound, up
  to `ceiling` (`max_dispatches_per_flush`).

Nothing else changes the bound, so the noise of short submissions (the event loop's own latency,
a submission's fixed cost) never chops work that runs fast. Until it has measured anything, a
software device (lavapipe, where a batch of a real model takes tens of seconds and the first batch
is encoded before anything completed) submits one dispatch at a time, a GPU the whole `ceiling`.

A single dispatch is never split: a kernel that runs longer than `health_stall_s` reads as a hang.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

SOFTWARE_START = 1  # dispatches per submission on a software device before anything was measured


class Pacer:
    def __init__(
        self,
        ceiling: int,
        target_s: float,
        software: bool,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.ceiling = ceiling
        self.target_s = target_s
        self._clock = clock or time.monotonic
        self.bound = min(ceiling, SOFTWARE_START) if software and target_s > 0 else ceiling
        self._in_flight: deque[tuple[int, int, float]] = deque()  # (submission, dispatches, submitted at)
        self._last_completion = 0.0

    def submitted(self, index: int, dispatches: int) -> None:
        if self.target_s > 0:
            self._in_flight.append((index, dispatches, self._clock()))

    def completed(self, index: int) -> None:
        """Submission `index` (and every one before it) completed: time it."""
        if not self._in_flight:
            return
        now = self._clock()
        dispatches, started = 0, now
        while self._in_flight and self._in_flight[0][0] <= index:
            _index, count, submitted_at = self._in_flight.popleft()
            if dispatches == 0:
                started = max(submitted_at, self._last_completion)
            dispatches += count
        self._last_completion = now
        if dispatches:  # copies alone teach nothing about dispatches
            self._learn(dispatches, now - started)

    def _learn(self, dispatches: int, took_s: float) -> None:
        if took_s > self.target_s:
            self.bound = max(1, min(self.bound, int(dispatches * self.target_s / took_s)))
        elif took_s <= self.target_s / 2 and dispatches >= self.bound:
            self.bound = min(self.ceiling, 2 * self.bound)

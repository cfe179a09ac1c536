"""How many dispatches one submission may hold: long work goes to the device in pieces.

Health is judged by progress (a device with work pending and nothing completing for
`health_stall_s` is unhealthy), so a submission must not run for anything near that long: work that
progresses has to be seen completing. The pacer measures how long this device takes per dispatch (a
submission's device time over its dispatches; the device runs submissions in order, so a
submission starts when it was submitted or when the one before it completed, whichever is later)
and bounds a submission to about `target_s` of it. A slower sample counts at once, a faster one
decays the estimate slowly: one heavy submission is enough to shorten the next ones. Until it has
measured anything, a software device (lavapipe, where a batch of a real model takes tens of
seconds and the first batch is encoded before anything completed) submits one dispatch at a time,
a GPU the whole `ceiling`.

A single dispatch is never split: a kernel that runs longer than `health_stall_s` reads as a hang.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

SOFTWARE_START = 1  # dispatches per submission on a software device before anything was measured
_DECAY = 0.9  # weight of the estimate against a faster sample


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
        self.per_dispatch_s = 0.0  # the estimate; 0: nothing measured yet
        self.bound = min(ceiling, SOFTWARE_START) if software and target_s > 0 else ceiling
        self._in_flight: deque[tuple[int, int, float]] = deque()  # (submission, dispatches, submitted at)
        self._last_completion = 0.0

    def submitted(self, index: int, dispatches: int) -> None:
        if self.target_s > 0:
            self._in_flight.append((index, dispatches, self._clock()))

    def completed(self, index: int) -> None:
        """Submission `index` (and every one before it) completed: measure what it took."""
        now = self._clock()
        dispatches, started = 0, now
        while self._in_flight and self._in_flight[0][0] <= index:
            _index, count, submitted_at = self._in_flight.popleft()
            if dispatches == 0 and count == 0:
                continue  # copies only: nothing to learn about dispatches
            if dispatches == 0:
                started = max(submitted_at, self._last_completion)
            dispatches += count
        self._last_completion = now
        if dispatches:
            self._learn((now - started) / dispatches)

    def _learn(self, sample: float) -> None:
        import logging
        old = self.bound
        if sample >= self.per_dispatch_s:
            self.per_dispatch_s = sample
        else:
            self.per_dispatch_s = _DECAY * self.per_dispatch_s + (1 - _DECAY) * sample
        if self.per_dispatch_s > 0:
            self.bound = max(1, min(self.ceiling, int(self.target_s / self.per_dispatch_s)))
        else:
            self.bound = self.ceiling
        if self.bound != old:
            open("/tmp/h14/pacer.log", "a").write(f"sample {sample:.4f} est {self.per_dispatch_s:.4f} bound {old} -> {self.bound}\n")

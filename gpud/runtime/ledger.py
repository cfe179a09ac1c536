"""The completion ledger of one device: numbered submissions and what waits on each.

Submissions are numbered 1, 2, 3... and complete in order. `after(index, fn)` runs `fn(error)` once
submission `index` has completed: at once if it already has, including when it is called from a
callback of that very completion (a session ended while its completion runs must still get its
memory back). A failed submission fails only its own waiters; a lost device fails every waiter,
now and later, and is reported once through `on_lost`.

For health (progress, not liveness) the ledger also keeps when each submission in flight was
submitted and when a submission last completed: `stalled_for` says how long work has been pending
on the device without any of it completing.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict, deque
from collections.abc import Callable

from gpud.backends.base import SubmissionFailed
from gpud_protocol.errors import DeviceLost, GpudError

log = logging.getLogger(__name__)

Done = Callable[[BaseException | None], None]



class CompletionLedger:
    def __init__(self, on_lost: Callable[[DeviceLost], None]) -> None:
        self._on_lost = on_lost
        self.submitted = 0
        self.completed = 0
        self.lost: DeviceLost | None = None
        self._callbacks: defaultdict[int, list[Done]] = defaultdict(list)
        self._failed: dict[int, GpudError] = {}  # recent failed submissions
        self.failures = 0
        self.last_completion = time.monotonic()  # when a submission last completed
        self._submitted_at: deque[float] = deque()  # monotonic submit times of those in flight, oldest first

    @property
    def in_flight(self) -> int:
        return self.submitted - self.completed

    @property
    def pending_index(self) -> int:
        """The number the submission being encoded now will get."""
        return self.submitted + 1

    def next_submission(self) -> int:
        self.submitted += 1
        self._submitted_at.append(time.monotonic())
        return self.submitted

    def stalled_for(self, now: float) -> float:
        """Seconds that work has been pending (submitted, not completed) with nothing completing; 0 when idle."""
        if not self._submitted_at or self.lost is not None:
            return 0.0
        return max(0.0, now - max(self.last_completion, self._submitted_at[0]))

    def after(self, index: int, fn: Done) -> None:
        """Run `fn(error)` once submission `index` has completed (now, if it has)."""
        if self.lost is not None:
            fn(self.lost)
        elif index <= self.completed:
            fn(self._failed.get(index))
        else:
            self._callbacks[index].append(fn)

    def complete(self, index: int, error: BaseException | None = None) -> None:
        """Submission `index` (and every earlier one) finished; `error` is None, a SubmissionFailed
        for this submission alone, or anything else for a lost device."""
        if self.lost is not None:
            return
        if error is not None and not isinstance(error, SubmissionFailed):
            self.lose(error if isinstance(error, DeviceLost) else DeviceLost(str(error)))
            return
        first = self.completed + 1
        self.completed = max(self.completed, index)  # before the callbacks: they may add to this index
        for _ in range(min(self.completed - first + 1, len(self._submitted_at))):
            self._submitted_at.popleft()
        self.last_completion = time.monotonic()
        if error is not None:
            self.failures += 1
            log.error("submission %d failed: %s", index, error)
            self._failed[index] = error
        for done in range(first, index + 1):
            failure = self._failed.get(done)
            while callbacks := self._callbacks.pop(done, None):  # callbacks may append to this index
                for fn in callbacks:
                    self._run(fn, failure)
        while len(self._failed) > 64:  # remembered for late callers, within a bound
            del self._failed[min(self._failed)]

    def lose(self, error: DeviceLost) -> None:
        """The device is gone: fail every waiter, now and later; report it once."""
        if self.lost is not None:
            return
        self.lost = error
        self._submitted_at.clear()
        while self._callbacks:
            index = min(self._callbacks)
            for fn in self._callbacks.pop(index):
                self._run(fn, error)
        self._on_lost(error)

    def _run(self, fn: Done, error: BaseException | None) -> None:
        try:
            fn(error)
        except Exception:  # one waiter's bug must not strand the others
            log.exception("completion callback failed")

    def stats(self) -> dict[str, int]:
        return {
            "submitted": self.submitted,
            "completed": self.completed,
            "in_flight": self.in_flight,
            "failed_submissions": self.failures,
        }

"""When to flush: the coalescing policy of one device, backend-independent.

Work is encoded as it arrives and submitted when someone needs a result (a readback, sync or
flush op asks for it), when the pending command buffer holds as many dispatches as the pacer allows
(at most `max_dispatches_per_flush`; fewer where they take long, see `gpud.runtime.pacing`), or
when `flush_deadline_ms` has passed since work became pending. The server calls `after_drain` once
per drain of the socket, so work that arrived together is submitted together. Every submission
starts here, whoever asks for it (a staging pool that ran dry, a synchronize, the drain at shutdown).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from gpud.runtime.pacing import Pacer


class FlushPolicy:
    def __init__(self, flush: Callable[[], None], pacer: Pacer, deadline_ms: float) -> None:
        self._flush = flush
        self.pacer = pacer
        self._deadline_s = deadline_ms / 1000
        self._wanted = False
        self._timer: asyncio.TimerHandle | None = None
        self.flushed_at = 0.0  # perf_counter of the last flush (for request traces)
        self.flushing = False  # inside a flush (tests check that every submit comes through here)

    def want(self) -> None:
        """A result is awaited: flush at the end of this drain."""
        self._wanted = True

    @property
    def max_dispatches(self) -> int:
        """Dispatches one submission may hold now."""
        return self.pacer.bound

    def dispatched(self, pending_dispatches: int) -> None:
        """Dispatches were encoded: submit once the pending command buffer holds its share."""
        if pending_dispatches >= self.pacer.bound:
            self.flush()

    def make_room(self, pending_dispatches: int, coming: int) -> None:
        """`coming` dispatches that go together (a piece of a replay) are about to be encoded:
        submit what is pending first if they would take it past its share."""
        if pending_dispatches and pending_dispatches + coming > self.pacer.bound:
            self.flush()

    def after_drain(self, has_pending: bool) -> None:
        if self._wanted:
            self.flush()
        elif has_pending and self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._deadline_s, self._deadline)

    def flush(self) -> None:
        self._wanted = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.flushed_at = time.perf_counter()  # before: a completion may be reported inside the flush
        self.flushing = True
        try:
            self._flush()
        finally:
            self.flushing = False

    def _deadline(self) -> None:
        self._timer = None
        self.flush()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

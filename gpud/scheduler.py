"""When to flush: the coalescing policy, backend-independent.

Work is encoded as it arrives and submitted when someone needs a result (a readback, sync or
flush op asks for it), when the pending command buffer holds `max_dispatches_per_flush`
dispatches, or when `flush_deadline_ms` has passed since work became pending. The server calls
`after_messages` once per drain of the socket, so work that arrived together is submitted together.
"""

from __future__ import annotations

import asyncio
import time

from gpud.backends.base import Backend
from gpud.config import Config


class Scheduler:
    def __init__(self, backend: Backend, config: Config) -> None:
        self.backend = backend
        self._max_dispatches = config.max_dispatches_per_flush
        self._deadline_s = config.flush_deadline_ms / 1000
        self._flush_wanted = False
        self._timer: asyncio.TimerHandle | None = None
        self.flushed_at = 0.0  # perf_counter of the last flush (for request traces)

    def want_flush(self) -> None:
        """A result is awaited: flush at the end of this drain."""
        self._flush_wanted = True

    def dispatched(self) -> None:
        if self.backend.dispatches_pending >= self._max_dispatches:
            self.flush()

    def after_messages(self) -> None:
        if self._flush_wanted:
            self.flush()
        elif self.backend.has_pending and self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._deadline_s, self._deadline)

    def flush(self) -> None:
        self._flush_wanted = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.backend.flush()
        self.flushed_at = time.perf_counter()

    def _deadline(self) -> None:
        self._timer = None
        self.flush()

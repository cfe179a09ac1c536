"""Device memory of one runtime: allocations (reusing freed memory of the same size), views, and
releases that wait for the work using a buffer; freeing itself runs on the submit worker."""

from __future__ import annotations

import functools
import logging
from typing import Any

from gpud.backends.base import Buffer
from gpud.runtime.state import RuntimeState
from gpud_protocol.errors import OutOfMemory

log = logging.getLogger(__name__)


class Memory(RuntimeState):
    memory_in_use: int
    live_buffers: int

    def alloc(self, nbytes: int) -> Buffer:
        self._check_alive()
        native = self.freed.take(nbytes)
        if native is None:
            try:
                native = self.device.alloc(nbytes)
            except OutOfMemory:
                self._drop_caches()
                native = self.device.alloc(nbytes)
        buffer = Buffer(next(self._ids), nbytes, native, self.index)
        self.memory_in_use += nbytes
        self.live_buffers += 1
        if not self.device.zero_on_alloc and nbytes:
            self.device.encode_zero(native, nbytes)
            self._encoded_with(buffer)
        return buffer

    def view(self, base: Buffer, offset: int, nbytes: int) -> Buffer:
        """A view of `nbytes` at `offset` into `base` (never released itself: release the base)."""
        assert offset >= 0 and offset + nbytes <= base.nbytes
        allocation = base.base or base
        return Buffer(next(self._ids), nbytes, base.native, self.index, offset=base.offset + offset, base=allocation)

    def release(self, buffer: Buffer) -> None:
        """Free `buffer` once every submission that uses it has completed (and no copy between devices holds it)."""
        if buffer.id in self._holds:
            self._held[buffer.id] = buffer
            return
        self.ledger.after(buffer.last_use, lambda _error: self._destroy(buffer))

    def _destroy(self, buffer: Buffer) -> None:
        if buffer.native is None:
            return
        native, buffer.native = buffer.native, None
        self.memory_in_use -= buffer.nbytes
        self.live_buffers -= 1
        try:
            self.device.forget(native)
        except Exception:  # reported, never raised from a completion
            log.exception("device %d: freeing a buffer failed", self.index)
        self._free(self.freed.keep(buffer.nbytes, native))

    def _free(self, natives: list[Any]) -> None:
        # A free may synchronize (cuMemFree) or queue behind a submit: never on the loop thread.
        for native in natives:
            self.submitter.run(functools.partial(self.device.free, native), _log_failure)

    def _destroy_staging(self, staging: Any) -> None:
        self.submitter.run(lambda: self.device.destroy_staging(staging), _log_failure)

    def _drop_caches(self) -> None:
        # Only when an allocation failed, before it is tried again (on this thread, as the
        # allocation is): the kept memory is idle, so freeing it waits for nothing of its own.
        for native in self.freed.clear():
            self.device.free(native)
        self.device.drop_caches()
        self.uploads.clear_idle()
        self.downloads.clear_idle()


def _log_failure(_result: Any, error: BaseException | None) -> None:
    if error is not None:
        log.error("releasing device memory failed: %s", error)

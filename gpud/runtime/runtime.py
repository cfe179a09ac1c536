"""DeviceRuntime: everything the daemon keeps per GPU, around one backend `Device`.

It owns the flush policy, the completion ledger, the staging pools, the program cache and the two
worker threads (submits, compiles). Sessions and the server talk to it, never to the device:
every encode, every flush and every completion goes through here. It is made of parts, one job
each (`state` says what they share): `memory`, `programs`, `encoding`, `transfers`, `submission`.

Nothing here blocks the event loop. An op that must wait (a full staging pool, a device with too
many submissions in flight, a compile) gets a `Wait` back: the session parks on it and resumes the
op where it stopped, while every other session goes on.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from collections import defaultdict, deque
from collections.abc import Callable
from typing import Any

from gpud.backends.base import Device, Program
from gpud.runtime.cache import LruCache
from gpud.runtime.encoding import Encoding
from gpud.runtime.flush import FlushPolicy
from gpud.runtime.freed import FreedMemory
from gpud.runtime.idle import IdleRelease
from gpud.runtime.ledger import CompletionLedger
from gpud.runtime.memory import Memory
from gpud.runtime.pacing import Pacer
from gpud.runtime.pools import StagingPool
from gpud.runtime.programs import Programs
from gpud.runtime.state import Deliver, Owner, Prepared, RuntimeSettings
from gpud.runtime.submission import Submission
from gpud.runtime.submitter import Worker
from gpud.runtime.transfers import Transfers
from gpud.runtime.waits import Wait
from gpud_protocol.errors import DeviceLost, GpudError

__all__ = ["Deliver", "DeviceRuntime", "Owner", "Prepared", "RuntimeSettings", "Wait"]

log = logging.getLogger(__name__)


class DeviceRuntime(Memory, Programs, Encoding, Transfers, Submission):
    def __init__(
        self,
        device: Device,
        settings: RuntimeSettings,
        on_lost: Callable[[DeviceRuntime, DeviceLost], None],
        reply_part_bytes: int = 4 << 20,
    ) -> None:
        self.device = device
        self.index = device.index
        self.number = self.index  # the index clients know it by: a process-per-device worker's, its front's
        self.others_elsewhere = False  # a process-per-device worker's: the daemon's other devices are other processes'
        self._on_lost = on_lost
        loop = device.loop
        self.ledger = CompletionLedger(lambda error: on_lost(self, error))
        device.on_lost = self.ledger.lose
        pacer = Pacer(settings.max_dispatches_per_flush, settings.submission_target_s, device.software)
        self.policy = FlushPolicy(self._submit, pacer, settings.flush_deadline_ms)
        self.max_in_flight = settings.max_submissions_in_flight
        half = settings.staging_pool_bytes // 2
        self.uploads: StagingPool[Any] = StagingPool(
            lambda n: device.make_staging(n, True), self._destroy_staging, half, self.flush
        )
        self.downloads: StagingPool[Any] = StagingPool(
            lambda n: device.make_staging(n, False), self._destroy_staging, half, self.flush
        )
        self.chunk_bytes = min(16 << 20, self.uploads.largest_class())
        self.part_bytes = max(4096, min(reply_part_bytes, self.downloads.largest_class()))
        self.programs: LruCache[tuple[Any, ...], Program] = LruCache(settings.kernel_cache_size)
        # Reuse needs the zero fill the runtime encodes itself: not where allocations come zeroed.
        self.freed = FreedMemory(0 if device.zero_on_alloc else settings.reuse_memory_bytes)
        pools = (self.uploads, self.downloads)
        self.idle = IdleRelease(loop, settings.pool_idle_release_s, pools, self.freed, self._free)
        self._compiling: dict[tuple[Any, ...], asyncio.Future[Program]] = {}
        self.submitter = Worker(f"gpud-submit-{self.index}", loop)
        self.compiler = Worker(f"gpud-compile-{self.index}", loop, device.compile_threads)
        self._completion = threading.Condition()  # the submit worker waits on it for serial submits
        self._ids = itertools.count(1)
        self.encoded = 0  # ops encoded since the last flush
        self.dispatches_pending = 0
        self.dispatch_count = 0
        self.memory_in_use = 0
        self.live_buffers = 0
        self.counters: defaultdict[str, int] = defaultdict(int)
        self.sessions = 0  # sessions whose default device this is (placement)
        # Seconds from a readback part's copy being encoded to its completion, the latest 1,024 (metrics).
        self.readback_latencies: deque[float] = deque(maxlen=1024)
        self._awaited = False  # a readback or sync waits on the pending command buffer
        self._owners: set[Owner] = set()  # who has work in the pending command buffer
        self._unsaturated: asyncio.Future[None] | None = None
        self._submitting = False  # inside `_submit`: completions reported now wait for the loop
        self.issued = 0
        self._on_issued = {}
        self._holds = {}
        self._held = {}
        self.closed = False
        self.neighbours = [self]  # the daemon gives every runtime the list of all (`DeviceRuntime.neighbours`)

    def info(self) -> dict[str, Any]:
        info = {"index": self.number, "backend": self.device.kind, **self.device.info()}
        if (memory := self.device.memory()) is not None:
            info["memory_free"], info["memory_total"] = memory
        return info

    def stats(self) -> dict[str, Any]:
        return {
            "index": self.number,
            "backend": self.device.kind,
            "memory_in_use": self.memory_in_use,
            "live_buffers": self.live_buffers,
            "dispatches": self.dispatch_count,
            **self.ledger.stats(),
            "program_cache": self.programs.stats(),
            "upload_staging": self.uploads.stats(),
            "download_staging": self.downloads.stats(),
            "reused_memory": self.freed.stats(),
            **self.counters,
            **self.device.stats(),
        }

    async def close(self, timeout: float = 10.0) -> None:
        """Finish outstanding work, then release the pools and the device."""
        self.policy.close()
        self.idle.close()
        if self.ledger.lost is None:
            try:
                await asyncio.wait_for(self.synchronize(), timeout)
            except (TimeoutError, GpudError) as exc:
                log.warning("device %d: outstanding work did not finish at shutdown: %s", self.index, exc)
        self.uploads.clear_idle()
        self.downloads.clear_idle()
        self._free(self.freed.clear())
        self.closed = True
        with self._completion:
            self._completion.notify_all()
        self.submitter.close(timeout)  # runs the frees still queued
        self.compiler.close(1.0)
        self.programs.clear()
        self.device.close()

"""Moving bytes between the host and the device, and between devices: uploads and readbacks in
chunks through the staging pools (in op order, waiting when a pool is exhausted), and copies to
another device, peer to peer or through host memory."""

from __future__ import annotations

import asyncio
import functools
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from gpud.backends.base import Buffer
from gpud.runtime.crossing import PeerCopy
from gpud.runtime.ledger import Done
from gpud.runtime.pools import StagingPool
from gpud.runtime.state import Deliver, Owner, RuntimeState
from gpud.runtime.waits import Wait, outcome, settle, then
from gpud_protocol.errors import DeviceLost, InternalError


class Transfers(RuntimeState):
    def copy_to(self, src: Buffer, target: Transfers, dst: Buffer, owner: Owner) -> Wait:
        """Copy `src` (this device) into `dst` (another device), keeping op order on both. Peer to peer
        where the devices allow it, ordered on the devices (crossing.py): the caller goes on once the copy
        is ordered before its later work on both. Else through host memory: the copy starts once `dst`'s
        earlier uses have completed, and the caller goes on once it has completed."""
        self._check_alive()
        self.counters["cross_device_copies"] += 1
        if self.device.peer_copy(target.device):
            done = PeerCopy(self, target, src, dst, owner).start()
            return Wait(done, lambda: outcome(done))
        target.want_flush()
        idle: asyncio.Future[None] = self.device.loop.create_future()
        target.after_use(dst, lambda error: settle(idle, None, error))
        return Wait(idle, lambda: self._host_copy(src, target, dst, owner))

    def _host_copy(self, src: Buffer, target: Transfers, dst: Buffer, owner: Owner) -> Wait | None:
        data = bytearray(src.nbytes)
        done: asyncio.Future[None] = self.device.loop.create_future()
        remaining = self.parts(src.nbytes)

        def deliver(part: int, chunk: bytes | memoryview | None, error: BaseException | None) -> None:
            nonlocal remaining
            if error is not None or chunk is None:
                settle(done, None, error or DeviceLost("copy failed"))
                return
            offset = part * self.part_bytes
            data[offset : offset + len(chunk)] = chunk
            remaining -= 1
            if remaining == 0:
                settle(done, None)

        def upload() -> Wait | None:
            done.result()  # raises the download's error
            return target.upload(dst, memoryview(data), owner)

        self.counters["host_copy_bytes"] += src.nbytes
        return then(self.download(src, deliver, owner), lambda: Wait(done, upload))

    def upload(self, buffer: Buffer, data: memoryview, owner: Owner, start: int = 0, at: int = 0) -> Wait | None:
        """Encode a host-to-device copy of `data` into `buffer` from byte `at` on, in chunks through
        the staging pool; it keeps its place in op order. Returns a Wait when the pool is exhausted
        (resume goes on from `start`)."""
        self._check_alive()
        position = start
        while position < data.nbytes:
            count = min(self.chunk_bytes, data.nbytes - position)
            since = self.uploads.returns
            got = self.uploads.try_acquire(count)
            if got is None:
                resume = functools.partial(self.upload, buffer, data, owner, position, at)
                return Wait(self.uploads.returned(since), resume)
            staging, size = got
            try:
                self.device.write_staging(staging, data[position : position + count])
                self.device.encode_upload(staging, buffer.native, buffer.offset + at + position, count)
            except BaseException:
                self.uploads.discard(staging, size)
                raise
            self._encoded_with(buffer)
            self._owners.add(owner)
            self.ledger.after(self.ledger.pending_index, self._recycler(self.uploads, staging, size, True))
            self.counters["upload_bytes"] += count
            position += count
        return None

    def upload_all(self, uploads: Sequence[tuple[Buffer, memoryview]], owner: Owner) -> Wait | None:
        """`upload` of each (buffer, data) in turn; a Wait when the pool is exhausted (resume goes on)."""
        for index, (buffer, data) in enumerate(uploads):
            wait = self.upload(buffer, data, owner)
            if wait is not None:
                return then(wait, functools.partial(self.upload_all, uploads[index + 1 :], owner))
        return None

    def parts(self, nbytes: int) -> int:
        """How many reply parts a readback of `nbytes` takes."""
        return max(1, math.ceil(nbytes / self.part_bytes))

    def download(self, buffer: Buffer, deliver: Deliver, owner: Owner, first: int = 0) -> Wait | None:
        """Encode device-to-host copies of `buffer`, one per reply part; `deliver(part, data, error)`
        runs for each in order once its copy completed. Returns a Wait when the pool is exhausted."""
        self._check_alive()
        nbytes = buffer.nbytes
        if nbytes == 0:
            deliver(0, b"", None)
            return None
        encoded_at = time.perf_counter()
        for part in range(first, self.parts(nbytes)):
            offset = part * self.part_bytes
            count = min(self.part_bytes, nbytes - offset)
            since = self.downloads.returns
            got = self.downloads.try_acquire(count)
            if got is None:
                resume = functools.partial(self.download, buffer, deliver, owner, part)
                return Wait(self.downloads.returned(since), resume)
            staging, size = got
            try:
                self.device.encode_download(buffer.native, buffer.offset + offset, staging, count)
            except BaseException:
                self.downloads.discard(staging, size)
                raise
            self._encoded_with(buffer)
            self._owners.add(owner)
            self.counters["download_bytes"] += count
            self.ledger.after(
                self.ledger.pending_index,
                lambda error, p=part, s=staging, z=size, c=count, t=encoded_at: self._downloaded(  # type: ignore[misc]
                    p, s, z, c, deliver, error, t
                ),
            )
        self._awaited = True
        self.policy.want()
        return None

    def _downloaded(
        self,
        part: int,
        staging: Any,
        size: int,
        count: int,
        deliver: Deliver,
        error: BaseException | None,
        encoded_at: float = 0.0,
    ) -> None:
        if encoded_at:
            self.readback_latencies.append(time.perf_counter() - encoded_at)
        if error is not None:
            self.downloads.discard(staging, size)
            deliver(part, None, error)
            return
        try:
            data = self.device.read_staging(staging, count)
        except Exception as exc:
            self.downloads.discard(staging, size)
            # That read alone failed: the device and every other session go on.
            deliver(part, None, InternalError(f"reading its staging buffer failed ({exc}); nothing else is affected"))
            return
        self.device.recycle_staging(staging, False, self._returner(self.downloads, staging, size))
        deliver(part, data, None)

    def _recycler(self, pool: StagingPool[Any], staging: Any, size: int, upload: bool) -> Done:
        def recycle(error: BaseException | None) -> None:
            if error is not None:
                pool.discard(staging, size)
            else:
                self.device.recycle_staging(staging, upload, self._returner(pool, staging, size))

        return recycle

    def _returner(self, pool: StagingPool[Any], staging: Any, size: int) -> Callable[[bool], None]:
        def returned(ok: bool) -> None:
            if ok and not self.closed:
                pool.give_back(staging, size)
            else:
                pool.discard(staging, size)

        return returned

"""DeviceRuntime: everything the daemon keeps per GPU, around one backend `Device`.

It owns the flush policy, the completion ledger, the staging pools, the program cache and the two
worker threads (submits, compiles). Sessions and the server talk to it, never to the device:
every encode, every flush and every completion goes through here.

Nothing here blocks the event loop. An op that must wait (a full staging pool, a device with too
many submissions in flight, a compile) gets a `Wait` back: the session parks on it and resumes the
op where it stopped, while every other session goes on.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import math
import threading
import time
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NamedTuple, Protocol

from gpud.backends.base import Arg, Buffer, Device, DispatchStep, GraphStep, Program, SubmissionFailed, same_memory
from gpud.runtime.cache import LruCache
from gpud.runtime.flush import FlushPolicy
from gpud.runtime.freed import FreedMemory
from gpud.runtime.graph import Piece, Replayable, buffers_of, split
from gpud.runtime.idle import IdleRelease
from gpud.runtime.ledger import CompletionLedger, Done
from gpud.runtime.pacing import Pacer
from gpud.runtime.pools import StagingPool
from gpud.runtime.submitter import Worker
from gpud_protocol import KernelOptions
from gpud_protocol.errors import DeviceLost, GpudError, InternalError, InvalidArgument, OutOfMemory

log = logging.getLogger(__name__)


class Wait(NamedTuple):
    """An op that cannot go on yet: await `ready`, then call `resume()` (which may wait again)."""

    ready: Awaitable[Any]
    resume: Callable[[], Wait | None]


class Prepared(NamedTuple):
    """A dispatch checked and packed once; `DeviceRuntime.dispatch` encodes it as often as asked."""

    buffers: tuple[Buffer, ...]  # marked as used by every submission that encodes it
    packed: Any  # the backend's packed form; None: an empty grid


class Owner(Protocol):
    """Whoever encodes work (a session): told when a submission holding its work was refused."""

    def work_lost(self, error: GpudError) -> None: ...


Deliver = Callable[[int, "bytes | memoryview | None", "BaseException | None"], None]


class RuntimeSettings(Protocol):
    @property
    def max_dispatches_per_flush(self) -> int: ...

    @property
    def flush_deadline_ms(self) -> float: ...

    @property
    def submission_target_s(self) -> float: ...

    @property
    def max_submissions_in_flight(self) -> int: ...

    @property
    def staging_pool_bytes(self) -> int: ...

    @property
    def kernel_cache_size(self) -> int: ...

    @property
    def reuse_memory_bytes(self) -> int: ...

    @property
    def pool_idle_release_s(self) -> float: ...


class DeviceRuntime:
    def __init__(
        self,
        device: Device,
        settings: RuntimeSettings,
        on_lost: Callable[[DeviceRuntime, DeviceLost], None],
        reply_part_bytes: int = 4 << 20,
    ) -> None:
        self.device = device
        self.index = device.index
        self._on_lost = on_lost
        loop = device.loop
        self.ledger = CompletionLedger(lambda error: on_lost(self, error))
        device.on_lost = self.ledger.lose
        pacer = Pacer(settings.max_dispatches_per_flush, settings.submission_target_s, device.software)
        self.policy = FlushPolicy(self.flush, pacer, settings.flush_deadline_ms)
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
        self.compiler = Worker(f"gpud-compile-{self.index}", loop)
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
        self.closed = False

    # ------------------------------------------------------------------ memory

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
        """Free `buffer` once every submission that uses it has completed."""
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

    # ------------------------------------------------------------------ programs

    def program(self, source: str, entry: str, options: KernelOptions) -> Program | asyncio.Future[Program]:
        """The compiled program, or a future of it (compiled once on the compile worker, whoever asks)."""
        key = self.device.program_key(source, entry, options)
        if (program := self.programs.get(key)) is not None:
            return program
        future = self._compiling.get(key)
        if future is None:
            future = self.compiler.future(lambda: self.device.compile(key, source, entry, options))
            self._compiling[key] = future
            future.add_done_callback(lambda f: self._compiled(key, f))
        return future

    def _compiled(self, key: tuple[Any, ...], future: asyncio.Future[Program]) -> None:
        self._compiling.pop(key, None)
        if not future.cancelled() and future.exception() is None:
            self.programs.put(key, future.result())
            self.counters["compiles"] += 1
        else:
            self.counters["compile_errors"] += 1

    # ------------------------------------------------------------------ encoding

    @property
    def has_pending(self) -> bool:
        return self.encoded > 0

    @property
    def saturated(self) -> bool:
        """Too many submissions in flight: new GPU work waits (`unsaturated`) instead of piling up."""
        return self.ledger.in_flight >= self.max_in_flight

    def unsaturated(self) -> asyncio.Future[None]:
        if self._unsaturated is None or self._unsaturated.done():
            future: asyncio.Future[None] = self.device.loop.create_future()
            self._unsaturated = future
            self.counters["throttle_waits"] += 1
            self.ledger.after(self.ledger.completed + 1, lambda _error: _settle(future, None))
        return self._unsaturated

    def prepare(self, program: Program, grid: tuple[int, int, int], args: Sequence[Arg]) -> Prepared:
        self._check_alive()
        gx, gy, gz = grid
        mx, my, mz = self.device.max_grid
        if gx > mx or gy > my or gz > mz:
            raise InvalidArgument(f"grid {grid} exceeds the device limit {self.device.max_grid}")
        buffers = tuple([arg for arg in args if type(arg) is Buffer])
        packed = self.device.prepare(program, grid, args)
        buffers += tuple({id(b.base): b.base for b in buffers if b.base is not None}.values())  # views' allocations
        if self.device.prepare_uses_buffers:
            self._encoded_with(*buffers)
        return Prepared(buffers, packed if gx and gy and gz else None)

    def dispatch(self, prepared: Prepared, owner: Owner) -> None:
        if prepared.packed is None:
            return  # an empty grid: nothing to run
        self.device.encode_dispatch(prepared.packed)
        self.encoded += 1
        index = self.ledger.submitted + 1
        for buffer in prepared.buffers:
            buffer.last_use = index
        self._owners.add(owner)
        self.dispatches_pending += 1
        self.dispatch_count += 1
        self.policy.dispatched(self.dispatches_pending)

    def instantiate(self, steps: Sequence[GraphStep]) -> Replayable:
        """A recorded step in this backend's replayable form (checked now, like a dispatch)."""
        self._check_alive()
        max_grid = self.device.max_grid
        kept: list[GraphStep] = []
        for step in steps:
            if isinstance(step, DispatchStep):
                gx, gy, gz = step.grid
                if gx > max_grid[0] or gy > max_grid[1] or gz > max_grid[2]:
                    raise InvalidArgument(f"grid {step.grid} exceeds the device limit {max_grid}")
                if not (gx and gy and gz):
                    continue  # an empty grid: nothing to run
            elif step.nbytes == 0:
                continue
            kept.append(step)
        if self.device.prepare_uses_buffers:  # validation probes go with the next submission, even if one fails
            self._encoded_with(*buffers_of(kept))
        # On a software device every dispatch is a piece of its own: a replay may take many seconds there.
        pieces = []
        for steps in split(kept, 1 if self.device.software else 0):
            dispatches = sum(1 for step in steps if isinstance(step, DispatchStep))
            pieces.append(Piece(self.device.instantiate(steps), buffers_of(steps), dispatches))
        self.counters["graphs_instantiated"] += 1
        return Replayable(tuple(pieces))

    def replay(self, replayable: Replayable, values: Sequence[int | float], owner: Owner) -> None:
        """Encode one replay into the pending command buffer, as if its ops had arrived one by one."""
        self._check_alive()
        self.counters["graph_replays"] += 1
        for piece in replayable.pieces:  # an empty step has none: nothing to encode
            self.policy.make_room(self.dispatches_pending, piece.dispatches)
            self.device.encode_replay(piece.native, values)
            self._encoded_with(*piece.buffers)
            self._owners.add(owner)
            self.dispatches_pending += piece.dispatches
            self.dispatch_count += piece.dispatches
            if len(replayable.pieces) > 1:
                self.policy.dispatched(self.dispatches_pending)

    def copy(self, src: Buffer, dst: Buffer, owner: Owner) -> None:
        """A copy between two buffers of this device, in op order."""
        self._check_alive()
        if same_memory(src, dst):
            if src.nbytes == 0 or (src.offset, src.nbytes) == (dst.offset, dst.nbytes):
                return  # onto itself: nothing to do
            # Parts of one buffer: WebGPU would refuse the whole submission, so refuse this op alone.
            raise InvalidArgument("copy: source and destination are parts of the same memory, which WebGPU refuses")
        if src.nbytes == 0:
            return
        self.device.encode_copy(src.native, src.offset, dst.native, dst.offset, min(src.nbytes, dst.nbytes))
        self._encoded_with(src, dst)
        self._owners.add(owner)

    def copy_to(self, src: Buffer, target: DeviceRuntime, dst: Buffer, owner: Owner) -> Wait:
        """Copy `src` (this device) into `dst` (another device), keeping op order on both: the copy
        starts once `dst`'s earlier uses on its device have completed, and the caller goes on only
        once the copy has completed. Peer to peer where the devices allow it, else through host memory."""
        self._check_alive()
        self.counters["cross_device_copies"] += 1
        target.want_flush()
        idle: asyncio.Future[None] = self.device.loop.create_future()
        target.after_use(dst, lambda error: _settle(idle, None, error))
        if self.device.peer_copy(target.device):
            return Wait(idle, lambda: self._peer_copy(src, target, dst, owner))
        return Wait(idle, lambda: self._host_copy(src, target, dst, owner))

    def _peer_copy(self, src: Buffer, target: DeviceRuntime, dst: Buffer, owner: Owner) -> Wait:
        self.device.encode_peer_copy(src.native + src.offset, target.device, dst.native + dst.offset, src.nbytes)
        self._encoded_with(src)
        self._owners.add(owner)
        self.counters["peer_copy_bytes"] += src.nbytes
        done: asyncio.Future[None] = self.device.loop.create_future()
        self.after_pending(lambda error: _settle(done, None, error))
        self.want_flush()
        return Wait(done, lambda: _result(done))

    def _host_copy(self, src: Buffer, target: DeviceRuntime, dst: Buffer, owner: Owner) -> Wait | None:
        data = bytearray(src.nbytes)
        done: asyncio.Future[None] = self.device.loop.create_future()
        remaining = self.parts(src.nbytes)

        def deliver(part: int, chunk: bytes | memoryview | None, error: BaseException | None) -> None:
            nonlocal remaining
            if error is not None or chunk is None:
                _settle(done, None, error or DeviceLost("copy failed"))
                return
            offset = part * self.part_bytes
            data[offset : offset + len(chunk)] = chunk
            remaining -= 1
            if remaining == 0:
                _settle(done, None)

        def upload() -> Wait | None:
            done.result()  # raises the download's error
            return target.upload(dst, memoryview(data), owner)

        self.counters["host_copy_bytes"] += src.nbytes
        return _then(self.download(src, deliver, owner), lambda: Wait(done, upload))

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

    def _encoded_with(self, *buffers: Buffer) -> None:
        self.encoded += 1
        index = self.ledger.submitted + 1
        for buffer in buffers:
            buffer.last_use = index
            if buffer.base is not None:
                buffer.base.last_use = index

    def _check_alive(self) -> None:
        if self.ledger.lost is not None:
            raise self.ledger.lost

    # ------------------------------------------------------------------ completion

    def after(self, fn: Done) -> None:
        """Run `fn(error)` once all work encoded so far has completed (now, if it has)."""
        self.ledger.after(self.ledger.submitted + (1 if self.encoded else 0), fn)

    def after_pending(self, fn: Done) -> None:
        """Run `fn(error)` once the submission now being encoded has completed."""
        self.ledger.after(self.ledger.pending_index, fn)

    def after_use(self, buffer: Buffer, fn: Done) -> None:
        self.ledger.after(buffer.last_use, fn)

    def want_flush(self) -> None:
        """A result is awaited: flush at the end of this drain."""
        self._awaited = True
        self.policy.want()

    def after_drain(self) -> None:
        self.policy.after_drain(self.encoded > 0)

    def flush(self) -> None:
        """Submit the pending command buffer: on this thread when the device is idle (it cannot
        block then), else on the submit worker, behind the submissions it already holds."""
        if not self.encoded or self.ledger.lost is not None:
            return
        commands = self.device.take_commands()
        index = self.ledger.next_submission()
        self.policy.pacer.submitted(index, self.dispatches_pending)
        self.encoded = 0
        self.dispatches_pending = 0
        awaited, self._awaited = self._awaited, False
        owners, self._owners = self._owners, set()
        self.counters["flushes"] += 1
        if owners:
            self.ledger.after(index, lambda error: _tell_owners(owners, error))
        if self.submitter.idle and self.ledger.in_flight == 1:
            try:
                submitted = self.device.submit(commands)
            except Exception as exc:
                self._refused(index, exc)
                return
            self.device.watch(submitted, lambda error: self._complete(index, error), awaited)
            return
        self.counters["worker_submits"] += 1
        if self.device.serial_submits:

            def submit() -> Any:
                self._wait_for(index - 1)
                if self.closed:
                    raise DeviceLost("the daemon stopped before this work was submitted")
                return self.device.submit(commands)

        else:

            def submit() -> Any:
                return self.device.submit(commands)

        self.submitter.run(submit, lambda s, error: self._submitted(index, s, error, awaited))

    def _submitted(self, index: int, submitted: Any, error: BaseException | None, awaited: bool) -> None:
        if error is not None:
            self._refused(index, error)
        else:
            self.device.watch(submitted, lambda failure: self._complete(index, failure), awaited)

    def _complete(self, index: int, error: BaseException | None) -> None:
        self.policy.pacer.completed(index)
        self.ledger.complete(index, error)
        with self._completion:
            self._completion.notify_all()

    def _wait_for(self, index: int) -> None:
        """On the submit worker: until submission `index` has completed (or the device is gone)."""
        with self._completion:
            while self.ledger.completed < index and self.ledger.lost is None and not self.closed:
                self._completion.wait(0.05)

    def _refused(self, index: int, error: BaseException) -> None:
        """A submit raised: a lost device, or a submission refused on its own (completed in order)."""
        if isinstance(error, DeviceLost):
            self.ledger.lose(error)
            return
        failure = SubmissionFailed(f"device {self.index} refused submission {index}: {error}")
        self.ledger.after(index - 1, lambda _error: self.ledger.complete(index, failure))

    def synchronize(self) -> asyncio.Future[None]:
        """Flush, and resolve once the device has done everything encoded so far."""
        future: asyncio.Future[None] = self.device.loop.create_future()
        self.after(lambda error: _settle(future, None, error))
        self.flush()
        return future

    # ------------------------------------------------------------------ info

    def info(self) -> dict[str, Any]:
        info = {"index": self.index, "backend": self.device.kind, **self.device.info()}
        if (memory := self.device.memory()) is not None:
            info["memory_free"], info["memory_total"] = memory
        return info

    def stats(self) -> dict[str, Any]:
        return {
            "index": self.index,
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


def _settle(future: asyncio.Future[Any], value: Any, error: BaseException | None = None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(value)
    else:
        future.set_exception(error)


def _result(future: asyncio.Future[None]) -> None:
    future.result()


def _then(wait: Wait | None, next_step: Callable[[], Wait | None]) -> Wait | None:
    """Run `next_step` after `wait` (and whatever it leads to) is done."""
    if wait is None:
        return next_step()
    return Wait(wait.ready, lambda: _then(wait.resume(), next_step))


def _log_failure(_result: Any, error: BaseException | None) -> None:
    if error is not None:
        log.error("releasing device memory failed: %s", error)


def _tell_owners(owners: set[Owner], error: BaseException | None) -> None:
    if isinstance(error, SubmissionFailed):
        for owner in owners:
            owner.work_lost(error)

"""The backend contract, documented once; `webgpu.py` and `cuda.py` implement its primitives.

A backend owns one device and one stream (an ordered queue of GPU work). Ops are *encoded* into
the pending command buffer as they arrive and *submitted* by `flush`. Submissions are numbered
1, 2, 3...; every buffer remembers the number of the submission that last used it
(`Buffer.last_use`), so that:

- `release` destroys a buffer only after that submission has completed (ordering rule 3);
- staging buffers go back to their pool only after the submission that used them completed;
- `after(fn)` runs `fn` once everything encoded so far has completed.

Completions arrive in submission order, on the event-loop thread, through the `done` callback
given to `_submit`. A completion with an error is fatal: the GPU context is unusable (sticky
CUDA errors, a lost WebGPU device), so every waiter fails and `on_fatal` stops the daemon.

Policy shared by every backend lives here: caches and their bounds, the out-of-memory retry after
dropping caches, argument and grid checks, transfer chunking, statistics.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import itertools
from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from gpud.cache import LruCache
from gpud.config import Config
from gpud_protocol import ArgKind, KernelOptions
from gpud_protocol.errors import DeviceLost, InvalidArgument, OutOfMemory

Done = Callable[[BaseException | None], None]
Scalar = tuple[ArgKind, int | float]


@dataclasses.dataclass(eq=False)
class Buffer:
    """A device allocation of at least `nbytes` (backends may round the real size up)."""

    id: int
    nbytes: int
    native: Any
    last_use: int = 0  # number of the last submission that uses it; 0: never used


@dataclasses.dataclass(eq=False)
class Kernel:
    key: tuple[Any, ...]
    entry: str
    native: Any
    block: tuple[int, int, int] | None
    writes: frozenset[int] | None  # positions (among tensor args) the kernel writes; None: all


Arg = Buffer | Scalar


@dataclasses.dataclass(eq=False, slots=True)
class Prepared:
    """A dispatch checked and packed once (see `Backend.prepare`)."""

    buffers: tuple[Buffer, ...]  # marked as used by every submission that encodes it
    native: Any  # the backend's packed form; None: an empty grid


def kernel_key(source: str, entry: str, options: KernelOptions, *extra: Any) -> tuple[Any, ...]:
    """Exact cache key: a hash of the source plus every option as a separate tuple member."""
    digest = hashlib.sha256(source.encode()).hexdigest()
    return (digest, entry, options.block, options.flags, options.writes, *extra)


class Backend(ABC):
    name: ClassVar[str]
    #: the largest workgroup/block count per grid dimension
    max_grid: tuple[int, int, int] = ((1 << 31) - 1, 65535, 65535)

    def __init__(self, config: Config, on_fatal: Callable[[BaseException], None]) -> None:
        self.config = config
        self._on_fatal = on_fatal
        self._kernels: LruCache[tuple[Any, ...], Kernel] = LruCache(config.kernel_cache_size)
        self._ids = itertools.count(1)
        self._submitted = 0
        self._completed = 0
        self._callbacks: defaultdict[int, list[Done]] = defaultdict(list)
        self._encoded = 0  # ops encoded since the last flush
        self.dispatches_pending = 0
        self.dispatch_count = 0
        self.memory_in_use = 0
        self.live_buffers = 0
        self.counters: defaultdict[str, int] = defaultdict(int)
        self.fatal_error: BaseException | None = None

    # ------------------------------------------------------------------ public interface

    def device_info(self) -> dict[str, Any]:
        """Name, vendor, memory: what the welcome message tells clients."""
        return {"backend": self.name}

    def kernel(self, source: str, entry: str, options: KernelOptions) -> Kernel:
        """Compile (or fetch from the cache) a kernel; raises CompileError with the log."""
        key = self._kernel_key(source, entry, options)
        if (kernel := self._kernels.get(key)) is None:
            kernel = self._compile(key, source, entry, options)
            self._kernels.put(key, kernel)
            self.counters["compiles"] += 1
        return kernel

    def alloc(self, nbytes: int) -> Buffer:
        try:
            native = self._alloc(nbytes)
        except OutOfMemory:
            self._drop_caches()
            native = self._alloc(nbytes)
        self.memory_in_use += nbytes
        self.live_buffers += 1
        return Buffer(next(self._ids), nbytes, native)

    def release(self, buffer: Buffer) -> None:
        """Free `buffer` once every submission that uses it has completed."""
        self.after_use(buffer, lambda _err: self._destroy(buffer))

    async def upload(self, buffer: Buffer, data: memoryview) -> None:
        """Encode a host-to-device copy; it keeps its place in op order."""
        if data.nbytes != buffer.nbytes:
            raise InvalidArgument(f"upload of {data.nbytes} bytes into a tensor of {buffer.nbytes}")
        self.counters["upload_bytes"] += data.nbytes
        chunk = self._chunk_bytes()
        for offset in range(0, data.nbytes, chunk):
            await self._encode_upload(buffer, offset, data[offset : offset + chunk])
            self._mark(buffer)
            self._encoded += 1

    def prepare(self, kernel: Kernel, grid: tuple[int, int, int], args: Sequence[Arg]) -> Prepared:
        """Check and pack a dispatch once; `dispatch_prepared` may then encode it many times."""
        gx, gy, gz = grid
        mx, my, mz = self.max_grid
        if gx > mx or gy > my or gz > mz:
            raise InvalidArgument(f"grid {grid} exceeds the device limit {self.max_grid}")
        buffers = tuple([arg for arg in args if type(arg) is Buffer])
        if not (gx and gy and gz):
            return Prepared(buffers, None)  # an empty grid: nothing to run
        return Prepared(buffers, self._prepare(kernel, grid, args))

    def dispatch_prepared(self, prepared: Prepared) -> None:
        if prepared.native is None:
            return
        self._encode_dispatch(prepared)
        self._encoded += 1
        index = self._submitted + 1
        for buffer in prepared.buffers:
            buffer.last_use = index
        self.dispatches_pending += 1
        self.dispatch_count += 1

    def dispatch(self, kernel: Kernel, grid: tuple[int, int, int], args: Sequence[Arg]) -> None:
        self.dispatch_prepared(self.prepare(kernel, grid, args))

    def copy(self, src: Buffer, dst: Buffer) -> None:
        if src.nbytes != dst.nbytes:
            raise InvalidArgument(f"copy of {src.nbytes} bytes into a tensor of {dst.nbytes}")
        if src is dst or src.nbytes == 0:
            return
        self._encode_copy(src, dst, src.nbytes)
        self._encoded += 1
        self._mark(src)
        self._mark(dst)

    async def download(self, buffer: Buffer) -> asyncio.Future[bytes]:
        """Encode a device-to-host copy; the future resolves with the bytes once it completed."""
        self.counters["download_bytes"] += buffer.nbytes
        chunk = self._chunk_bytes()
        parts = []
        for offset in range(0, buffer.nbytes, chunk):
            parts.append(await self._encode_download(buffer, offset, min(chunk, buffer.nbytes - offset)))
            self._mark(buffer)
            self._encoded += 1
        if not parts:
            empty: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
            empty.set_result(b"")
            return empty
        if len(parts) == 1:
            return parts[0]
        return asyncio.ensure_future(_join(parts))

    def flush(self) -> None:
        """Submit the pending command buffer (no-op when nothing is pending)."""
        if not self._encoded:
            return
        if self.fatal_error is not None:
            raise self.fatal_error
        self._encoded = 0
        self.dispatches_pending = 0
        self._submitted += 1
        index = self._submitted
        self.counters["flushes"] += 1
        try:
            self._submit(lambda err: self._complete(index, err))
        except Exception as exc:  # a failed submit poisons everything encoded in it
            self._complete(index, DeviceLost(f"submit failed: {exc}"))

    @property
    def has_pending(self) -> bool:
        return self._encoded > 0

    def after(self, fn: Done) -> None:
        """Run `fn(error)` once all work encoded so far has completed (now, if it has)."""
        self._after_index(self._submitted + (1 if self._encoded else 0), fn)

    def after_pending(self, fn: Done) -> None:
        """Run `fn(error)` once the submission now being encoded has completed."""
        self._after_index(self._submitted + 1, fn)

    def after_use(self, buffer: Buffer, fn: Done) -> None:
        """Run `fn(error)` once the last submission that uses `buffer` has completed."""
        self._after_index(buffer.last_use, fn)

    async def synchronize(self) -> None:
        """Flush and wait (without blocking the loop) until the device has done everything."""
        self.flush()
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.after(lambda err: settle(future, None, err))
        await future

    async def throttle(self, max_in_flight: int) -> None:
        """Wait while more than `max_in_flight` submissions are on the device (back-pressure)."""
        loop = asyncio.get_running_loop()
        while self._submitted - self._completed > max_in_flight and self.fatal_error is None:
            self.counters["throttle_waits"] += 1
            future: asyncio.Future[None] = loop.create_future()
            self._after_index(self._completed + 1, lambda _err, f=future: settle(f, None, None))  # type: ignore[misc]
            await future

    def stats(self) -> dict[str, Any]:
        return {
            "backend": self.name,
            "memory_in_use": self.memory_in_use,
            "live_buffers": self.live_buffers,
            "submitted": self._submitted,
            "completed": self._completed,
            "dispatches": self.dispatch_count,
            "kernel_cache": self._kernels.stats(),
            **self.counters,
        }

    async def close(self) -> None:
        """Wait for outstanding work, then drop caches; live buffers are the caller's to release."""
        if self.fatal_error is None:
            await self.synchronize()
        self._drop_caches()
        self._kernels.clear()

    # ------------------------------------------------------------------ backend primitives

    @abstractmethod
    def _compile(self, key: tuple[Any, ...], source: str, entry: str, options: KernelOptions) -> Kernel: ...

    @abstractmethod
    def _alloc(self, nbytes: int) -> Any:
        """Allocate device memory; raise OutOfMemory when the device has none left."""

    @abstractmethod
    def _free(self, buffer_id: int, native: Any) -> None: ...

    @abstractmethod
    async def _encode_upload(self, buffer: Buffer, offset: int, data: memoryview) -> None: ...

    @abstractmethod
    def _prepare(self, kernel: Kernel, grid: tuple[int, int, int], args: Sequence[Arg]) -> Any:
        """Validate the arguments against the kernel and pack them: everything that does not
        depend on the dispatch's position in the command buffer."""

    @abstractmethod
    def _encode_dispatch(self, prepared: Prepared) -> None: ...

    @abstractmethod
    def _encode_copy(self, src: Buffer, dst: Buffer, nbytes: int) -> None: ...

    @abstractmethod
    async def _encode_download(self, buffer: Buffer, offset: int, nbytes: int) -> asyncio.Future[bytes]: ...

    @abstractmethod
    def _submit(self, done: Done) -> None:
        """Submit pending work; call `done(None)` on the loop thread once the device finished it."""

    def _kernel_key(self, source: str, entry: str, options: KernelOptions) -> tuple[Any, ...]:
        return kernel_key(source, entry, options)

    @abstractmethod
    def _drop_caches(self) -> None:
        """Release what can be rebuilt (idle staging buffers, bind groups...) to free memory."""

    def _chunk_bytes(self) -> int:
        """Transfers larger than this go through several staging buffers."""
        return 16 << 20

    # ------------------------------------------------------------------ bookkeeping

    def _mark(self, buffer: Buffer) -> None:
        buffer.last_use = self._submitted + 1

    def _destroy(self, buffer: Buffer) -> None:
        if buffer.native is None:
            return
        native, buffer.native = buffer.native, None
        self.memory_in_use -= buffer.nbytes
        self.live_buffers -= 1
        self._free(buffer.id, native)

    def _after_index(self, index: int, fn: Done) -> None:
        if self.fatal_error is not None:
            fn(self.fatal_error)
        elif index <= self._completed:
            fn(None)
        else:
            self._callbacks[index].append(fn)

    def _complete(self, index: int, error: BaseException | None) -> None:
        first_failure = error is not None and self.fatal_error is None
        if first_failure:
            self.fatal_error = error if isinstance(error, DeviceLost) else DeviceLost(str(error))
        if self.fatal_error is not None:
            index = max(self._callbacks, default=index)  # fail everything still waiting
        for done_index in range(self._completed + 1, index + 1):
            for fn in self._callbacks.pop(done_index, ()):
                fn(self.fatal_error)
        self._completed = max(self._completed, index)
        if first_failure and self.fatal_error is not None:
            self._on_fatal(self.fatal_error)  # once: the daemon stops


def settle(future: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(value)
    else:
        future.set_exception(error)


async def _join(parts: list[asyncio.Future[bytes]]) -> bytes:
    return b"".join([await part for part in parts])

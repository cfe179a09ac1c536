"""WebGPU device (wgpu-py): memory, staging, the pending command buffer, submission and completion.

A pending command buffer is one command encoder whose compute pass holds every dispatch until a
copy needs the pass closed. Uploads copy through MAP_WRITE staging buffers *inside* the encoder:
`queue.write_buffer` on the tensor would run ahead of dispatches still in the unsubmitted encoder.
Readbacks copy into MAP_READ staging buffers, mapped after the submit: the maps are the completion
signal (a 4-byte fence copy when nothing is read back; wgpu-py 0.32's on_submitted_work_done
fails in its cffi callback). Every copy is rounded to WebGPU's 4-byte rule.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import wgpu

from gpud.backends.base import Arg, Device, Done, Program
from gpud.backends.webgpu.compiler import compile_wgsl
from gpud.backends.webgpu.dispatch import Dispatcher
from gpud.backends.webgpu.reports import OrderedReports
from gpud_protocol import KernelOptions
from gpud_protocol.errors import DeviceLost, InvalidArgument, OutOfMemory

log = logging.getLogger(__name__)

_STORAGE = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST


def round4(nbytes: int) -> int:
    return max(4, (nbytes + 3) & ~3)


class Commands(NamedTuple):
    encoder: Any
    reads: list[tuple[Any, int]]  # download stagings and their byte counts, mapped at completion
    uniforms: bytes | None
    fence: Any
    probes: list[Any]  # finished validation probes, submitted ahead of the encoder


class _Receiver:
    """What `GPUPromise._chain` calls with the outcome (it calls the `_set_input` and `_set_error`
    of the promise it chains to; wgpu-py pinned below 0.33, tests/backends/webgpu check it)."""

    __slots__ = ("_failed", "_ok")

    def __init__(self, ok: Callable[[Any], None], failed: Callable[[Exception], None]) -> None:
        self._ok, self._failed = ok, failed

    def _set_input(self, result: Any) -> None:
        self._ok(result)

    def _set_error(self, error: Exception) -> None:
        self._failed(error)


class WebGpuDevice(Device):
    kind = "webgpu"
    prepare_uses_buffers = True

    def __init__(self, index: int, loop: asyncio.AbstractEventLoop, adapter: Any, settings: Any) -> None:
        super().__init__(index, loop)
        self._adapter_info = dict(adapter.info)
        self.software = self._adapter_info.get("adapter_type", "").upper() == "CPU"
        self.serial_submits = self.software  # lavapipe's queue.submit blocks while earlier work runs
        # The op library's float16 kernels need shader-f16 (lavapipe and the common GPUs have it).
        features = [f for f in ("shader-f16",) if f in adapter.features]
        self.features = frozenset(features)
        self._device = adapter.request_device_sync(label=f"gpud-{index}", required_features=features)
        self._queue = self._device.queue
        limits = self._device.limits
        per_dim = limits["max-compute-workgroups-per-dimension"]
        self._max_buffer = int(limits["max-buffer-size"])
        self.max_grid = (per_dim, per_dim, per_dim)
        self._dispatcher = Dispatcher(
            self._device,
            max(settings.max_dispatches_per_flush, settings.limits.max_graph_steps),
            settings.bind_group_cache_size,
            limits["max-storage-buffer-binding-size"],
        )
        self._encoder: Any = None
        self._pass: Any = None
        self._pipeline_in_pass: list[Any] = [None]
        self._reads: list[tuple[Any, int]] = []
        self._idle_fences: list[Any] = []
        self._reports = OrderedReports()
        self._map_failures: dict[int, Exception] = {}  # id(staging) -> why its map failed
        self._program_ids = 0
        self._closing = False
        # wgpu-py only logs device loss: watch its log and treat a loss as fatal.
        self._loss_watch = _DeviceLossWatch(loop, self._lost)
        logging.getLogger("wgpu").addHandler(self._loss_watch)

    def info(self) -> dict[str, Any]:
        info = self._adapter_info
        return {
            "name": info.get("device", ""),
            "vendor": info.get("vendor", ""),
            "adapter_type": info.get("adapter_type", ""),
            "api": info.get("backend_type", ""),
            "software": self.software,
        }

    # ------------------------------------------------------------------ memory and staging

    def alloc(self, nbytes: int) -> Any:
        if round4(nbytes) > self._max_buffer:
            raise InvalidArgument(f"{nbytes} bytes: this device's largest buffer is {self._max_buffer} bytes")
        try:
            return self._device.create_buffer(size=round4(nbytes), usage=_STORAGE)  # zero-filled by WebGPU
        except Exception as exc:
            raise OutOfMemory(f"cannot allocate {nbytes} bytes: {exc}") from None

    def forget(self, native: Any) -> None:
        self._dispatcher.forget_buffer(native)

    def free(self, native: Any) -> None:
        native.destroy()

    def make_staging(self, nbytes: int, upload: bool) -> Any:
        if upload:
            usage = wgpu.BufferUsage.MAP_WRITE | wgpu.BufferUsage.COPY_SRC
            return self._device.create_buffer(size=nbytes, usage=usage, mapped_at_creation=True)
        return self._device.create_buffer(size=nbytes, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)

    def destroy_staging(self, staging: Any) -> None:
        self._map_failures.pop(id(staging), None)
        staging.destroy()

    def write_staging(self, staging: Any, data: memoryview) -> None:
        size = round4(data.nbytes)
        if data.nbytes != size:
            data = memoryview(bytes(data) + bytes(size - data.nbytes))
        staging.write_mapped(data, 0)
        staging.unmap()

    def read_staging(self, staging: Any, nbytes: int) -> bytes | memoryview:
        if (failure := self._map_failures.pop(id(staging), None)) is not None:
            raise RuntimeError(f"mapping it failed: {failure}")
        data = staging.read_mapped(0, round4(nbytes))
        staging.unmap()
        return bytes(data[:nbytes]) if nbytes % 4 else data

    def recycle_staging(self, staging: Any, upload: bool, done: Callable[[bool], None]) -> None:
        if not upload:
            done(True)  # unmapped by read_staging: ready for the next copy
            return
        self._when_settled(staging.map_async("WRITE"), lambda _: done(True), lambda _exc: done(False))

    def drop_caches(self) -> None:
        self._dispatcher.clear()

    # ------------------------------------------------------------------ programs

    def compile(self, key: tuple[Any, ...], source: str, entry: str, options: KernelOptions) -> Program:
        self._program_ids += 1
        return compile_wgsl(self._device, key, source, entry, options, self._program_ids)

    def prepare(self, program: Program, grid: tuple[int, int, int], args: Sequence[Arg]) -> Any:
        return self._dispatcher.prepare(program, grid, args)

    def with_scalars(
        self, packed: Any, variables: Sequence[tuple[int, int, int, int]], values: Sequence[int | float]
    ) -> Any:
        scalars = list(packed[5])
        for _position, slot, index, _kind in variables:
            scalars[slot] = values[index]
        return (*packed[:5], tuple(scalars), packed[6], packed[4].pack(*scalars))

    # ------------------------------------------------------------------ encoding

    def _encoder_for_copy(self) -> Any:
        if self._pass is not None:
            self._pass.end()
            self._pass = None
            self._pipeline_in_pass[0] = None
        if self._encoder is None:
            self._encoder = self._device.create_command_encoder()
        return self._encoder

    def encode_dispatch(self, packed: Any) -> None:
        if self._pass is None:
            if self._encoder is None:
                self._encoder = self._device.create_command_encoder()
            self._pass = self._encoder.begin_compute_pass()
        self._dispatcher.encode(self._pass, packed, self._pipeline_in_pass)

    def encode_copy(self, src: Any, src_offset: int, dst: Any, dst_offset: int, nbytes: int) -> None:
        self._encoder_for_copy().copy_buffer_to_buffer(src, src_offset, dst, dst_offset, round4(nbytes))

    def encode_upload(self, staging: Any, dst: Any, offset: int, nbytes: int) -> None:
        self._encoder_for_copy().copy_buffer_to_buffer(staging, 0, dst, offset, round4(nbytes))

    def encode_download(self, src: Any, offset: int, staging: Any, nbytes: int) -> None:
        self._encoder_for_copy().copy_buffer_to_buffer(src, offset, staging, 0, round4(nbytes))
        self._reads.append((staging, nbytes))

    def take_commands(self) -> Commands:
        encoder = self._encoder_for_copy()
        self._encoder = None
        reads, self._reads = self._reads, []
        fence = None
        if not reads:
            fence = self._idle_fences.pop() if self._idle_fences else self._make_fence()
            encoder.copy_buffer_to_buffer(self._dispatcher.uniform, 0, fence, 0, 4)
        probes, self._dispatcher.finished_probes = self._dispatcher.finished_probes, []
        return Commands(encoder, reads, self._dispatcher.take_uniforms(), fence, probes)

    def submit(self, commands: Any) -> Commands:
        command_buffer = commands.encoder.finish()  # validation errors: a refused submission
        if commands.uniforms is not None:
            # write_buffer is ordered after earlier submits, so the uniform slots are reused safely.
            self._queue.write_buffer(self._dispatcher.uniform, 0, commands.uniforms)
        self._queue.submit([*commands.probes, command_buffer])
        return commands  # type: ignore[no-any-return]

    def watch(self, submitted: Any, done: Done, awaited: bool) -> None:
        commands: Commands = submitted
        report = self._reports.add(done)  # released in submission order
        if commands.fence is not None:
            fence = commands.fence

            def signalled(_: Any) -> None:
                fence.unmap()
                self._idle_fences.append(fence)
                report(None)

            def lost(exc: Exception) -> None:
                report(DeviceLost(f"queue failed: {exc}"))

            self._when_settled(fence.map_async("READ_NOSYNC", 0, 4), signalled, lost)
            return
        remaining = len(commands.reads)

        def settled() -> None:
            nonlocal remaining
            remaining -= 1
            if remaining == 0:
                report(None)

        def waiter(staging: Any) -> tuple[Callable[[Any], None], Callable[[Exception], None]]:
            def failed(exc: Exception) -> None:
                # That staging's read fails (read_staging says why), not the device: a lost device
                # is reported by the loss watch.
                self._map_failures[id(staging)] = exc
                settled()

            return lambda _: settled(), failed

        for staging, nbytes in commands.reads:
            self._when_settled(staging.map_async("READ_NOSYNC", 0, round4(nbytes)), *waiter(staging))

    def _when_settled(self, promise: Any, ok: Callable[[Any], None], failed: Callable[[Exception], None]) -> None:
        """`ok(result)` or `failed(error)`, on the loop thread, once `promise` settles.

        Not `promise.then(ok, failed)`: wgpu-py 0.32 keeps the promise of the branch not taken in
        its set of unresolved promises forever (about 1 KB a call); and not `await promise`, which
        fails under uvloop. A chained receiver creates no promise at all."""
        promise._chain(_Receiver(ok, failed))

    def _make_fence(self) -> Any:
        return self._device.create_buffer(size=4, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)

    def _lost(self, reason: str) -> None:
        if not self._closing:
            self.on_lost(DeviceLost(f"WebGPU device lost: {reason}"))

    def stats(self) -> dict[str, Any]:
        return self._dispatcher.stats()

    def close(self) -> None:
        self._closing = True
        logging.getLogger("wgpu").removeHandler(self._loss_watch)
        self._dispatcher.clear()
        self._dispatcher.uniform.destroy()
        for fence in self._idle_fences:
            fence.destroy()


class _DeviceLossWatch(logging.Handler):
    def __init__(self, loop: asyncio.AbstractEventLoop, on_lost: Callable[[str], None]) -> None:
        super().__init__(logging.ERROR)
        self._loop = loop
        self._on_lost = on_lost

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "device was lost" in message:
            self._loop.call_soon_threadsafe(self._on_lost, message)

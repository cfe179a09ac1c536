"""WebGPU backend (wgpu-py, WGSL). Runs on Vulkan/Metal/D3D12, and on lavapipe without a GPU.

Kernel convention: tensor arguments bind, in order, to `@group(0) @binding(0..n-1)`; scalar
arguments (f32/i32/u32, 4 bytes each) are packed in order into one uniform struct bound at
`@binding(n)`. A pending command buffer is one command encoder whose compute pass holds every
dispatch until a copy needs the pass closed.

Why each piece is there:
- scalars go through one uniform buffer with a 256-byte slot per dispatch position; the slots are
  written with one `queue.write_buffer` right before the submit, which WebGPU orders after earlier
  submits, so the buffer is reused across flushes safely;
- uploads copy through MAP_WRITE staging buffers *inside* the encoder: `queue.write_buffer` on the
  tensor would run ahead of dispatches still sitting in the unsubmitted encoder (ordering rule 1);
- readbacks copy into MAP_READ staging buffers and are mapped right after the submit;
- every copy is rounded to WebGPU's 4-byte rule; device buffers are allocated rounded up too.
"""

from __future__ import annotations

import asyncio
import logging
import re
import struct
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import wgpu

from gpud.backends.base import Arg, Backend, Buffer, Done, Kernel, Prepared, settle
from gpud.cache import LruCache
from gpud.config import Config
from gpud.pools import StagingPool
from gpud_protocol import ArgKind, KernelOptions
from gpud_protocol.errors import CompileError, DeviceLost, InvalidArgument, OutOfMemory

log = logging.getLogger(__name__)

SLOT_BYTES = 256  # uniform slot per dispatch; >= every adapter's minUniformBufferOffsetAlignment
_SCALAR_FORMAT = {ArgKind.F32: "f", ArgKind.I32: "i", ArgKind.U32: "I"}
_SCALAR_STRUCTS: dict[tuple[int, ...], struct.Struct] = {}
_WRITABLE_BINDING = re.compile(r"@binding\(\s*(\d+)\s*\)[^;]*?var\s*<\s*storage\s*,\s*read_write\s*>")
_STORAGE = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST


def _scalar_struct(kinds: tuple[int, ...]) -> struct.Struct:
    """The packer for one scalar signature (at most max_args kinds, so the table stays small)."""
    packer = _SCALAR_STRUCTS[kinds] = struct.Struct("<" + "".join(_SCALAR_FORMAT[ArgKind(k)] for k in kinds))
    return packer


def _round4(nbytes: int) -> int:
    return max(4, (nbytes + 3) & ~3)


class WebGpuBackend(Backend):
    name = "webgpu"

    def __init__(self, config: Config, on_fatal: Any) -> None:
        super().__init__(config, on_fatal)
        adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
        if adapter is None:
            raise DeviceLost("no WebGPU adapter (install a Vulkan driver, e.g. mesa-vulkan-drivers)")
        self._adapter_info = dict(adapter.info)
        self._device = adapter.request_device_sync(label="gpud")
        self._queue = self._device.queue
        limits = self._device.limits
        per_dim = limits["max-compute-workgroups-per-dimension"]
        self.max_grid = (per_dim, per_dim, per_dim)
        self._max_binding = limits["max-storage-buffer-binding-size"]
        self._encoder: Any = None
        self._pass: Any = None
        self._pipeline_in_pass: Any = None
        slots = config.max_dispatches_per_flush
        self._uniform = self._device.create_buffer(
            size=slots * SLOT_BYTES,
            usage=wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST | wgpu.BufferUsage.COPY_SRC,
        )
        self._uniform_host = bytearray(slots * SLOT_BYTES)
        self._uniform_used = 0
        self._bind_groups: LruCache[tuple[int, ...], Any] = LruCache(
            config.bind_group_cache_size, self._forget_bind_group
        )
        self._bind_groups_of_buffer: defaultdict[int, set[tuple[int, ...]]] = defaultdict(set)
        half = config.staging_pool_bytes // 2
        self._uploads: StagingPool[Any] = StagingPool(self._make_upload_staging, _destroy, half, self.flush)
        self._downloads: StagingPool[Any] = StagingPool(self._make_download_staging, _destroy, half, self.flush)
        self._reads: list[tuple[Any, int, int, asyncio.Future[bytes]]] = []
        self._closing = False
        self._idle_fences: list[Any] = []
        # wgpu-py only logs device loss: watch its log and treat a loss as fatal.
        self._loss_watch = _DeviceLossWatch(asyncio.get_running_loop(), self._lost)
        logging.getLogger("wgpu").addHandler(self._loss_watch)

    def device_info(self) -> dict[str, Any]:
        info = self._adapter_info
        return {
            "backend": self.name,
            "name": info.get("device", ""),
            "vendor": info.get("vendor", ""),
            "adapter_type": info.get("adapter_type", ""),
            "api": info.get("backend_type", ""),
        }

    # ------------------------------------------------------------------ resources

    def _compile(self, key: tuple[Any, ...], source: str, entry: str, options: KernelOptions) -> Kernel:
        if options.block is not None:
            raise InvalidArgument("WGSL kernels set their block size with @workgroup_size, not 'block'")
        if options.flags:
            raise InvalidArgument("WGSL kernels take no compiler flags")
        try:
            module = self._device.create_shader_module(code=source)
            pipeline = self._device.create_compute_pipeline(
                layout="auto", compute={"module": module, "entry_point": entry}
            )
        except Exception as exc:  # wgpu raises GPUValidationError / GPUError with the naga log
            raise CompileError(str(exc)) from None
        try:
            layout = pipeline.get_bind_group_layout(0)
        except Exception:
            layout = None  # the kernel binds nothing
        # WGSL states each binding's access: a declaration may add written bindings, never hide one.
        writes = {int(m) for m in _WRITABLE_BINDING.findall(source)} | set(options.writes or ())
        return Kernel(key, entry, (pipeline, layout, next(self._ids)), None, frozenset(writes))

    def _alloc(self, nbytes: int) -> Any:
        size = _round4(nbytes)
        try:
            return self._device.create_buffer(size=size, usage=_STORAGE)
        except Exception as exc:
            raise OutOfMemory(f"cannot allocate {nbytes} bytes: {exc}") from None

    def _free(self, buffer_id: int, native: Any) -> None:
        for key in self._bind_groups_of_buffer.pop(buffer_id, ()):
            self._bind_groups.pop(key)
        native.destroy()

    def _forget_bind_group(self, key: tuple[int, ...], _bind_group: Any) -> None:
        for buffer_id in key[2:]:
            if keys := self._bind_groups_of_buffer.get(buffer_id):
                keys.discard(key)

    def _drop_caches(self) -> None:
        self._bind_groups.clear()
        self._uploads.clear_idle()
        self._downloads.clear_idle()

    def _chunk_bytes(self) -> int:
        return min(16 << 20, self._uploads.largest_class())

    def _make_upload_staging(self, size: int) -> Any:
        usage = wgpu.BufferUsage.MAP_WRITE | wgpu.BufferUsage.COPY_SRC
        return self._device.create_buffer(size=size, usage=usage, mapped_at_creation=True)

    def _make_download_staging(self, size: int) -> Any:
        return self._device.create_buffer(size=size, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)

    # ------------------------------------------------------------------ encoding

    def _encoder_for_copy(self) -> Any:
        if self._pass is not None:
            self._pass.end()
            self._pass = None
            self._pipeline_in_pass = None
        if self._encoder is None:
            self._encoder = self._device.create_command_encoder()
        return self._encoder

    def _compute_pass(self) -> Any:
        if self._pass is None:
            if self._encoder is None:
                self._encoder = self._device.create_command_encoder()
            self._pass = self._encoder.begin_compute_pass()
        return self._pass

    def _prepare(self, kernel: Kernel, grid: tuple[int, int, int], args: Sequence[Arg]) -> tuple[Any, ...]:
        tensors: list[Buffer] = []
        kinds: list[int] = []
        values: list[int | float] = []
        for arg in args:
            if type(arg) is Buffer:
                tensors.append(arg)
            else:
                kinds.append(arg[0])  # type: ignore[index]
                values.append(arg[1])  # type: ignore[index]
        key = tuple(kinds)
        packer = (_SCALAR_STRUCTS.get(key) or _scalar_struct(key)) if kinds else None
        if packer is not None:
            packer.pack(*values)  # checks ranges now, not while encoding
        return (*kernel.native, tuple(tensors), packer, tuple(values), grid)

    def _encode_dispatch(self, prepared: Prepared) -> None:
        pipeline, layout, kernel_id, tensors, packer, values, grid = prepared.native
        slot = -1
        if packer is not None:
            if self._uniform_used * SLOT_BYTES == len(self._uniform_host):
                self.flush()
            slot = self._uniform_used
            packer.pack_into(self._uniform_host, slot * SLOT_BYTES, *values)
            self._uniform_used += 1
        key = (kernel_id, slot, *[t.id for t in tensors])
        bind_group = self._bind_groups.get(key)
        if bind_group is None and (tensors or packer is not None):
            bind_group = self._make_bind_group(layout, tensors, slot, key)
        compute = self._pass if self._pass is not None else self._compute_pass()
        if self._pipeline_in_pass is not pipeline:
            compute.set_pipeline(pipeline)
            self._pipeline_in_pass = pipeline
        if bind_group is not None:
            compute.set_bind_group(0, bind_group)
        compute.dispatch_workgroups(*grid)

    def _make_bind_group(self, layout: Any, tensors: Sequence[Buffer], slot: int, key: tuple[int, ...]) -> Any:
        if layout is None:
            raise InvalidArgument("this kernel declares no bindings but was given arguments")
        entries = []
        for binding, tensor in enumerate(tensors):
            if tensor.native.size > self._max_binding:
                raise InvalidArgument(f"tensor of {tensor.nbytes} bytes exceeds the binding limit {self._max_binding}")
            entries.append(
                {"binding": binding, "resource": {"buffer": tensor.native, "offset": 0, "size": tensor.native.size}}
            )
        if slot >= 0:
            uniform = {"buffer": self._uniform, "offset": slot * SLOT_BYTES, "size": SLOT_BYTES}
            entries.append({"binding": len(tensors), "resource": uniform})
        try:
            bind_group = self._device.create_bind_group(layout=layout, entries=entries)
        except Exception as exc:
            raise InvalidArgument(f"arguments do not match the kernel's bindings: {exc}") from None
        self._bind_groups.put(key, bind_group)
        for tensor in tensors:
            self._bind_groups_of_buffer[tensor.id].add(key)
        return bind_group

    def _encode_copy(self, src: Buffer, dst: Buffer, nbytes: int) -> None:
        self._encoder_for_copy().copy_buffer_to_buffer(src.native, 0, dst.native, 0, _round4(nbytes))

    async def _encode_upload(self, buffer: Buffer, offset: int, data: memoryview) -> None:
        size = _round4(data.nbytes)
        staging, size_class = await self._uploads.acquire(size)
        if data.nbytes != size:
            data = memoryview(bytes(data) + bytes(size - data.nbytes))
        staging.write_mapped(data, 0)
        staging.unmap()
        self._encoder_for_copy().copy_buffer_to_buffer(staging, 0, buffer.native, offset, size)
        self.after_pending(lambda err: self._remap_upload(staging, size_class, err))

    def _remap_upload(self, staging: Any, size_class: int, error: BaseException | None) -> None:
        if error is not None:
            self._uploads.discard(staging, size_class)
            return
        staging.map_async("WRITE").then(
            lambda _: self._uploads.give_back(staging, size_class),
            lambda _exc: self._uploads.discard(staging, size_class),
        )

    async def _encode_download(self, buffer: Buffer, offset: int, nbytes: int) -> asyncio.Future[bytes]:
        size = _round4(nbytes)
        staging, size_class = await self._downloads.acquire(size)
        self._encoder_for_copy().copy_buffer_to_buffer(buffer.native, offset, staging, 0, size)
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._reads.append((staging, size_class, nbytes, future))
        return future

    def _submit(self, done: Done) -> None:
        encoder = self._encoder_for_copy()
        self._encoder = None
        reads, self._reads = self._reads, []
        fence = None
        if not reads:
            # A mapped read completes only after the work submitted before it: a 4-byte copy into
            # a MAP_READ buffer at the end is the completion signal (wgpu-py 0.32's
            # on_submitted_work_done_async fails in its cffi callback).
            fence = self._idle_fences.pop() if self._idle_fences else self._make_fence()
            encoder.copy_buffer_to_buffer(self._uniform, 0, fence, 0, 4)
        command = encoder.finish()
        uniform = memoryview(self._uniform_host)[: self._uniform_used * SLOT_BYTES]
        self._uniform_used = 0
        # write_buffer is ordered after earlier submits, so the uniform slots are reused safely.
        if uniform:
            self._queue.write_buffer(self._uniform, 0, uniform)
        self._queue.submit([command])
        if fence is not None:
            self._watch_fence(fence, done)
        else:
            self._watch_reads(reads, done)

    def _watch_fence(self, fence: Any, done: Done) -> None:
        def signalled(_: Any) -> None:
            fence.unmap()
            self._idle_fences.append(fence)
            done(None)

        fence.map_async("READ_NOSYNC", 0, 4).then(signalled, lambda exc: done(DeviceLost(f"queue failed: {exc}")))

    def _watch_reads(self, reads: list[tuple[Any, int, int, asyncio.Future[bytes]]], done: Done) -> None:
        remaining = len(reads)

        def read_done(error: BaseException | None) -> None:
            nonlocal remaining
            remaining -= 1
            if remaining == 0 or error is not None:
                remaining = -(1 << 30)  # report once
                done(error)

        for staging, size_class, nbytes, future in reads:
            self._map_read(staging, size_class, nbytes, future, read_done)

    def _make_fence(self) -> Any:
        return self._device.create_buffer(size=4, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)

    def _map_read(self, staging: Any, size_class: int, nbytes: int, future: asyncio.Future[bytes], done: Done) -> None:
        def mapped(_: Any) -> None:
            data = staging.read_mapped(0, _round4(nbytes))
            staging.unmap()
            self._downloads.give_back(staging, size_class)
            settle(future, bytes(data[:nbytes]) if nbytes % 4 else data, None)
            done(None)

        def failed(exc: Exception) -> None:
            self._downloads.discard(staging, size_class)
            error = DeviceLost(f"readback failed: {exc}")
            settle(future, None, error)
            done(error)

        staging.map_async("READ_NOSYNC", 0, _round4(nbytes)).then(mapped, failed)

    def _lost(self, reason: str) -> None:
        if self.fatal_error is None and not self._closing:
            self.fatal_error = DeviceLost(f"WebGPU device lost: {reason}")
            self._on_fatal(self.fatal_error)

    def stats(self) -> dict[str, Any]:
        return {
            **super().stats(),
            "bind_group_cache": self._bind_groups.stats(),
            "upload_staging": self._uploads.stats(),
            "download_staging": self._downloads.stats(),
        }

    async def close(self) -> None:
        self._closing = True
        logging.getLogger("wgpu").removeHandler(self._loss_watch)
        await super().close()
        self._uploads.clear_idle()
        self._downloads.clear_idle()
        self._uniform.destroy()
        for fence in self._idle_fences:
            fence.destroy()


class _DeviceLossWatch(logging.Handler):
    def __init__(self, loop: asyncio.AbstractEventLoop, on_lost: Any) -> None:
        super().__init__(logging.ERROR)
        self._loop = loop
        self._on_lost = on_lost

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "device was lost" in message:
            self._loop.call_soon_threadsafe(self._on_lost, message)


def _destroy(buffer: Any) -> None:
    buffer.destroy()

"""CUDA device: memory, pinned staging, programs, peers (its pending commands: `commands`).

A context is current per thread, and the loop thread serves every device: each call into the driver
makes this device's context current first.
A program's module is unloaded once nobody holds the program and the next submission completed.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import itertools
import logging
import os
import weakref
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpud import ops
from gpud.backends.base import Arg, Device, Program, program_key
from gpud.backends.cuda import compiler, tma
from gpud.backends.cuda.commands import CudaCommands
from gpud.backends.cuda.driver import E, address, check, cu, error, host_alloc, host_free, nvrtc
from gpud.backends.cuda.launch import make_launch, pack
from gpud.backends.cuda.stream import Stream
from gpud_protocol import KernelOptions
from gpud_protocol.errors import DeviceLost, InvalidArgument

log = logging.getLogger(__name__)


class CudaDevice(CudaCommands):
    kind = "cuda"
    # NVRTC releases the GIL: the op library's families compile side by side on first use (a fresh MiniLM
    # forward asks for six at once, 45 s one after another on an H100's host)
    compile_threads = max(1, min(4, (os.cpu_count() or 2) // 2))
    zero_on_alloc = False

    def __init__(self, index: int, ordinal: int, loop: asyncio.AbstractEventLoop, settings: Any) -> None:
        super().__init__(index, loop)
        self.ordinal = ordinal
        try:
            check(cu.cuInit(0))
            self._device = check(cu.cuDeviceGet(ordinal))
        except Exception as exc:  # no driver library at all raises its own exception type
            raise DeviceLost(f"no CUDA device {ordinal}: {exc}") from None
        self._context = check(cu.cuDevicePrimaryCtxRetain(self._device))
        try:
            self._current()
            major, minor = self._attribute("COMPUTE_CAPABILITY_MAJOR"), self._attribute("COMPUTE_CAPABILITY_MINOR")
            grid = [self._attribute(f"MAX_GRID_DIM_{d}") for d in "XYZ"]
            block = [self._attribute(f"MAX_BLOCK_DIM_{d}") for d in "XYZ"]
            self.max_grid = (grid[0], grid[1], grid[2])
            self._max_block = (block[0], block[1], block[2])
            self._arch, self._cubin = compiler.target(major, minor)
            self._nvrtc_version = tuple(check(nvrtc.nvrtcVersion()))
            name = check(cu.cuDeviceGetName(256, self._device))
            self._info = {
                "name": name.split(b"\0", 1)[0].decode(errors="replace"),
                "vendor": "NVIDIA",
                "compute_capability": f"{major}.{minor}",
                "memory_bytes": int(check(cu.cuDeviceTotalMem(self._device))),
                "target": self._arch,
                "ordinal": ordinal,
            }
            self._max_args = max(settings.limits.max_args, 1)
            self._modules: dict[int, Any] = {}
            self._dead_modules: list[int] = []  # of programs nobody holds (finalizers append from any thread)
            self._stream = Stream(
                index, self._context, loop, settings, self._max_args, self._unload, self._dead_modules
            )
        except BaseException:
            cu.cuDevicePrimaryCtxRelease(self._device)
            raise
        self._cache_dir = Path(settings.cache_dir) / "cuda"
        self._ids = itertools.count(1)
        self._counters: Counter[str] = Counter(nvrtc_compiles=0, disk_cache_hits=0)  # under _builds.lock
        self._builds = compiler.OneBuild()  # compile workers: one NVRTC build of a family at a time
        self._commands: list[tuple[Any, ...]] = []
        self._run: list[tuple[Any, ...]] = []  # launches since the last other command
        self._peers: dict[int, bool] = {}
        self._closed = False
        self._lost = False

    def _attribute(self, name: str) -> int:
        attribute = getattr(cu.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}")
        return int(check(cu.cuDeviceGetAttribute(attribute, self._device)))

    def _current(self) -> None:
        check(cu.cuCtxSetCurrent(self._context), "making the CUDA context current")

    def _call(self, result: tuple[Any, ...], what: str) -> Any:
        """`check` for loop-thread calls outside a submission: a lost device found there is reported."""
        try:
            return check(result, what)
        except DeviceLost as exc:
            self._report_lost(exc)
            raise

    def _report_lost(self, exc: DeviceLost) -> None:
        """A lost device found outside a submission (alloc, staging, compile, free: any thread): tell
        the runtime, on the loop thread."""
        if not self._lost:
            self._lost = True
            log.error("device %d: %s", self.index, exc)
            self.loop.call_soon_threadsafe(self.on_lost, exc)

    def info(self) -> dict[str, Any]:
        return dict(self._info)

    def memory(self) -> tuple[int, int] | None:
        if self._closed:
            return None
        try:
            self._current()
            free, total = check(cu.cuMemGetInfo())
        except Exception:
            return None
        return int(free), int(total)

    def stats(self) -> dict[str, Any]:
        return {"modules": len(self._modules), **self._stream.graphs.stats(), **self._counters}

    # ------------------------------------------------------------------ memory and staging

    def alloc(self, nbytes: int) -> int:
        self._call(cu.cuCtxSetCurrent(self._context), "making the CUDA context current")
        return int(self._call(cu.cuMemAlloc(max(nbytes, 4)), f"allocating {nbytes} bytes"))

    def free(self, native: Any) -> None:
        try:
            cu.cuCtxSetCurrent(self._context)
            (status,) = cu.cuMemFree(native)
        except Exception:  # never raised (it runs on the submit worker): a loss is reported instead
            log.exception("device %d: cuMemFree", self.index)
            return
        if status:
            failure = error(status, "cuMemFree")
            if isinstance(failure, DeviceLost):
                self._report_lost(failure)
            else:
                log.error("device %d: %s", self.index, failure)

    def encode_zero(self, native: Any, nbytes: int) -> None:
        self._add(("zero", native, nbytes))

    def make_staging(self, nbytes: int, upload: bool) -> int:
        self._call(cu.cuCtxSetCurrent(self._context), "making the CUDA context current")
        try:
            return host_alloc(nbytes)
        except DeviceLost as exc:
            self._report_lost(exc)
            raise

    def destroy_staging(self, staging: Any) -> None:
        with contextlib.suppress(Exception):
            cu.cuCtxSetCurrent(self._context)
            host_free(staging)

    def write_staging(self, staging: Any, data: memoryview) -> None:
        ctypes.memmove(staging, address(data), data.nbytes)

    def read_staging(self, staging: Any, nbytes: int) -> bytes:
        return ctypes.string_at(staging, nbytes)

    # ------------------------------------------------------------------ programs

    def program_key(self, source: str, entry: str, options: KernelOptions) -> tuple[Any, ...]:
        return program_key(source, entry, options, self.kind, self._arch, self._nvrtc_version)

    def compile(self, key: tuple[Any, ...], source: str, entry: str, options: KernelOptions) -> Program:
        if options.block is None:
            raise InvalidArgument("CUDA kernels need options.block: threads per block, e.g. (256, 1, 1)")
        if not compiler.IDENTIFIER.fullmatch(entry):
            raise InvalidArgument(f"entry point {entry[:40]!r} is not a C identifier")
        stripped = compiler.check_source(source)
        flags = compiler.check_flags(options.flags)
        parameters = compiler.parse_parameters(stripped, entry)
        module_id = next(self._ids)
        try:
            self._current()
            # NVRTC builds every kernel of a source at once: the image is keyed by what it depends on
            # (not the entry point), so the other entries of a family load it from the disk cache
            image_key = (key[0], options.flags, self._arch, self._nvrtc_version)
            with self._builds.of(image_key):
                module = compiler.load_module(
                    self._cache_dir,
                    image_key,
                    source,
                    entry,
                    flags,
                    self._arch,
                    self._cubin,
                    self._counters,
                    self._builds.lock,
                )
            library = ops.waits_for_prior(source)
            layout = tma.layout(entry) if library else None  # the library's TMA kernels take tensor maps
            try:
                launch = make_launch(
                    module_id,
                    module,
                    entry,
                    options.block,
                    self._max_block,
                    self._max_args,
                    parameters,
                    options.shared,
                    layout,
                )
            except BaseException:
                cu.cuModuleUnload(module)
                raise
        except DeviceLost as exc:
            self._report_lost(exc)
            raise
        self._modules[module_id] = module
        if library:
            self._stream.graphs.waiting.add(module_id)
        if layout is not None:
            self._stream.graphs.tma_modules.add(module_id)
        interface = compiler.interface(parameters, options.writes, launch.sizes is not None)
        program = Program(key, entry, launch, *interface)
        weakref.finalize(program, self._dead_modules.append, module_id).atexit = False  # the list is never replaced
        return program

    def prepare(self, program: Program, grid: tuple[int, int, int], args: Sequence[Arg]) -> tuple[Any, ...]:
        return pack(program.native, program.entry, grid, args, self._max_args)

    def _unload(self, module_id: int) -> None:
        self._stream.graphs.waiting.discard(module_id)
        self._stream.graphs.tma_modules.discard(module_id)
        if (module := self._modules.pop(module_id, None)) is not None:
            self._stream.graphs.forget_all()  # rare; a graph must not outlive a kernel it launches
            (status,) = cu.cuModuleUnload(module)
            if status:
                log.debug("cuModuleUnload: %s", error(status))

    # ------------------------------------------------------------------ peers

    def peer_copy(self, other: Device) -> bool:
        if not isinstance(other, CudaDevice) or other is self:
            return False
        if self.can_access_peer(other):
            self.enable_peer(other)  # direct over NVLink/PCIe; without it the driver stages through the host
        return True

    def encode_peer_copy(
        self, src: Any, src_offset: int, other: Device, dst: Any, dst_offset: int, nbytes: int
    ) -> None:
        assert isinstance(other, CudaDevice)
        self._add(("peer", dst + dst_offset, other._context, src + src_offset, self._context, nbytes))

    def new_marker(self) -> Any:
        self._current()
        return self._call(cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING), "creating an event")

    def drop_marker(self, marker: Any) -> None:
        self._current()
        (status,) = cu.cuEventDestroy(marker)
        if status:
            log.debug("cuEventDestroy: %s", error(status))

    def can_access_peer(self, other: CudaDevice) -> bool:
        """Whether kernels and copies on this device can reach `other`'s memory (once `enable_peer`)."""
        if other is self:
            return True
        if (known := self._peers.get(other.ordinal)) is None:
            known = bool(check(cu.cuDeviceCanAccessPeer(self._device, other._device), "peer access"))
            self._peers[other.ordinal] = known
        return known

    def enable_peer(self, other: CudaDevice) -> None:
        if other is self:
            return
        self._current()
        (status,) = cu.cuCtxEnablePeerAccess(other._context, 0)
        if status and status != E.CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED:
            raise error(status, f"enabling access from device {self.ordinal} to device {other.ordinal}")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stream.close()
        for module_id in list(self._modules):
            self._unload(module_id)
        cu.cuDevicePrimaryCtxRelease(self._device)

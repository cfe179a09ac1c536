"""`gpud bench ops`'s device side: device 0 through gpud's DeviceRuntime (NVRTC, the disk cache) for
compiling the op library's kernels, raw driver calls for memory, launches and CUDA graphs."""

from __future__ import annotations

import asyncio
import ctypes
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

COPY_BYTES = 1 << 30


def check(result: Any) -> Any:
    err, *rest = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise RuntimeError(f"CUDA error {err}")
    return rest[0] if len(rest) == 1 else (rest or None)


def times(run: Callable[[], None], sync: Callable[[], None], reps: int) -> list[float]:
    run()
    sync()  # warm-up
    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        run()
        sync()
        samples.append(time.perf_counter() - start)
    return samples


def verify(what: str, got: np.ndarray, x: np.ndarray, w: np.ndarray, rows: int, tol: float = 1e-5) -> None:
    """The first `rows` rows against float64, with the tests' tolerance: 1e-5 (tol) of sum |x||w|, plus
    2e-3 |ref| for a float16 output."""
    x64, w64 = x[:rows].astype(np.float64), np.asarray(w, dtype=np.float64)
    ref, scale = x64 @ w64.T, np.abs(x64) @ np.abs(w64).T
    g = got[:rows].astype(np.float64)
    bound = tol * scale + (2e-3 if got.dtype == np.float16 else 0.0) * np.abs(ref)
    if np.isnan(g).any() or not np.all(np.abs(g - ref) <= bound):
        raise AssertionError(
            f"{what} computed a wrong result (worst error / bound {np.nanmax(np.abs(g - ref) / bound)})"
        )


class Device:
    """Device 0: gpud's DeviceRuntime compiles the kernels; raw driver calls do the rest."""

    def __init__(self, rt: Any, cu: Any) -> None:
        self.rt, self.cu = rt, cu
        device = rt.device
        self.context = device._context
        check(cu.cuCtxSetCurrent(self.context))
        self.name = device.info()["name"]
        attribute = cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE
        self.l2 = int(check(cu.cuDeviceGetAttribute(attribute, device._device)))
        self.stream = check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING))
        self.capability = str(device.info().get("compute_capability", ""))
        self.functions: dict[str, Any] = {}
        self.blocks: dict[str, int] = {}  # threads per block, by kernel
        self.shared: dict[str, int] = {}  # dynamic shared memory, by kernel
        self.natives: dict[str, Any] = {}  # the backend's Launch, by kernel (a TMA kernel's maps)
        self.buffers: list[Any] = []
        self.graphs: list[tuple[Any, Any]] = []  # (graph, executable)

    async def compile(self, name: str) -> None:
        from gpud.ops import source
        from gpud_protocol import KernelOptions
        from gpud_protocol.ops import KERNELS

        spec = KERNELS[name]
        block = spec.block
        got = self.rt.program(source(spec.family, "cuda"), name, KernelOptions((block, 1, 1), shared=spec.shared))
        program = await got if isinstance(got, asyncio.Future) else got
        self.functions[name] = program.native.function
        self.blocks[name] = block
        self.shared[name] = spec.shared
        self.natives[name] = program.native

    def alloc(self, nbytes: int) -> int:
        pointer = check(self.cu.cuMemAlloc(nbytes))
        self.buffers.append(pointer)
        return int(pointer)

    def free_all(self) -> None:
        self.sync()
        for graph, executable in self.graphs:
            self.cu.cuGraphExecDestroy(executable)
            self.cu.cuGraphDestroy(graph)
        self.graphs.clear()
        for pointer in self.buffers:
            self.cu.cuMemFree(pointer)
        self.buffers.clear()

    def upload(self, dst: int, array: np.ndarray) -> None:
        data = np.ascontiguousarray(array)
        # on self.stream, then waited for: a plain cuMemcpyHtoD from pageable memory may return before its
        # DMA lands, and self.stream (non-blocking) would not wait for it (products of stale x seen that way)
        check(self.cu.cuMemcpyHtoDAsync(dst, data.ctypes.data, data.nbytes, self.stream))
        self.sync()

    def copy(self, dst: int, src: int, nbytes: int) -> None:
        """A device copy on self.stream, waited for."""
        check(self.cu.cuMemcpyDtoDAsync(dst, src, nbytes, self.stream))
        self.sync()

    def download(self, src: int, shape: tuple[int, ...], dtype: str) -> np.ndarray:
        out = np.empty(shape, dtype)
        check(self.cu.cuMemcpyDtoH(out.ctypes.data, src, out.nbytes))
        return out

    def sync(self) -> None:
        check(self.cu.cuStreamSynchronize(self.stream))

    def copy_bandwidth(self, reps: int) -> float:
        """Bytes read plus written per second by a cuMemcpyDtoD of COPY_BYTES."""
        a, b = self.alloc(COPY_BYTES), self.alloc(COPY_BYTES)
        count = 5

        def run() -> None:
            for _ in range(count):
                check(self.cu.cuMemcpyDtoDAsync(b, a, COPY_BYTES, self.stream))

        best = min(times(run, self.sync, reps))
        for pointer in self.buffers[-2:]:
            self.cu.cuMemFree(pointer)
        del self.buffers[-2:]
        return 2 * COPY_BYTES * count / best

    def launch(self, name: str, grid: tuple[int, int, int], pointers: list[int], scalars: list[int]) -> None:
        """One launch, its parameters packed as the daemon packs them (a TMA kernel's x and w as maps)."""
        from gpud.backends.cuda.launch import _maps

        native = self.natives[name]
        values = [*pointers, *scalars]
        raw = struct.pack(f"<{len(pointers)}Q{len(scalars)}Q", *values)
        offsets = [8 * i for i in range(len(values))]
        if native.tma is not None:
            raw = _maps(native, native.tma, values) + raw[16:]
            offsets = native.tma.offsets(len(values))
        buffer = ctypes.create_string_buffer(raw, len(raw))
        self._kept = buffer  # alive until the next launch: the driver copies the values at the call
        address = ctypes.addressof(buffer)
        params = (ctypes.c_void_p * len(values))(*(address + o for o in offsets))
        check(
            self.cu.cuLaunchKernel(
                self.functions[name],
                *grid,
                self.blocks[name],
                1,
                1,
                self.shared[name],
                self.stream,
                ctypes.addressof(params),
                0,
            )
        )

    def graph(self, calls: Callable[[], None]) -> Callable[[], None]:
        """`calls` (launches on self.stream) captured into a CUDA graph; returns its replay."""
        cu = self.cu
        check(cu.cuStreamBeginCapture(self.stream, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL))
        try:
            calls()
        finally:
            graph = check(cu.cuStreamEndCapture(self.stream))
        executable = check(cu.cuGraphInstantiate(graph, 0))
        self.graphs.append((graph, executable))

        def replay() -> None:
            check(cu.cuGraphLaunch(executable, self.stream))

        return replay


def optional_torch() -> tuple[Any, str | None]:
    """PyTorch with CUDA initialised, or None and why (its rows are then skipped)."""
    try:
        import torch

        torch.cuda.init()
        return torch, None
    except Exception as exc:
        return None, repr(exc)


def open_device0(cache_dir: str) -> Device:
    """Device 0 through a DeviceRuntime compiling into `cache_dir`, its context current (in a running loop)."""
    from gpud.backends.cuda import open_device
    from gpud.backends.cuda.driver import cu
    from gpud.runtime.runtime import DeviceRuntime
    from gpud.service.config import Config

    config = Config(cache_dir=Path(cache_dir))
    rt = DeviceRuntime(open_device(0, 0, asyncio.get_running_loop(), config), config, lambda _rt, error: None)
    dev = Device(rt, cu)
    check(cu.cuCtxSetCurrent(dev.context))
    return dev


def weight_copies(dev: Device, w: np.ndarray, most: int) -> tuple[int, int, int]:
    """`w` uploaded, then copied on the device until the copies span 4x the L2 cache (2 to `most` of
    them, 256 bytes apart): their address, the stride between them and their count."""
    stride = -(-w.nbytes // 256) * 256
    copies = max(2, min(-(-4 * dev.l2 // w.nbytes), most))
    w_dev = dev.alloc(stride * copies)
    dev.upload(w_dev, w)
    for i in range(1, copies):
        dev.copy(w_dev + i * stride, w_dev, w.nbytes)
    return w_dev, stride, copies

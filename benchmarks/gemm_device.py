"""gemm_harness's device side: the protocol module alone, NVRTC builds of gpud/ops/matmul_tc.cu (its
kernels, and tile variants as extra entry points), launches through the driver
into PyTorch's context, and CUDA-graph timing. Needs cuda-python, torch and numpy only."""

from __future__ import annotations

import ctypes
import dataclasses
import importlib.util
import json
import math
import multiprocessing
import sys
import types
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "gpud" / "ops" / "matmul_tc.cu"
# put before the family's source, as gpud.ops.source does (gpud.ops.preludes: pdl first, for every family)
PRELUDES = [ROOT / "gpud" / "ops" / name for name in ("pdl.cu", "cp_async.cu", "products.cu")]


def with_preludes(path: Path) -> str:
    return "".join(p.read_text() for p in PRELUDES) + path.read_text()
PROTOCOL = ROOT / "protocol" / "gpud_protocol" / "ops" / "matmul.py"
MAX_GROUPS = 65535

# tile variants for --sweep: (BM, BN, BK, WM, WN, WK, S), as matmul_tc's template parameters
SWEEP = [
    (16, 16, 128, 1, 1, 8, 3),
    (16, 16, 256, 1, 1, 8, 3),
    (16, 32, 64, 1, 1, 4, 4),
    (16, 64, 64, 1, 2, 2, 4),
    (32, 32, 64, 1, 1, 4, 4),
    (32, 64, 64, 1, 2, 2, 4),
    (64, 32, 64, 2, 1, 2, 4),
    (64, 64, 64, 2, 2, 2, 3),
    (64, 64, 32, 2, 2, 1, 6),
    (64, 128, 32, 2, 2, 1, 4),
    (128, 64, 32, 2, 2, 1, 4),
    (128, 128, 32, 2, 2, 1, 3),
    (128, 128, 16, 2, 4, 1, 6),
    (128, 256, 16, 2, 4, 1, 4),
    (256, 128, 16, 4, 2, 1, 4),
]
ENTRIES = "// " + "-" * 64 + " entry points"


class Tile(NamedTuple):
    name: str
    bm: int
    bn: int
    threads: int


def sweep_tile(config: tuple[int, ...]) -> Tile:
    bm, bn, bk, wm, wn, wk, s = config
    return Tile(f"sweep_{bm}x{bn}x{bk}_w{wm}{wn}{wk}_s{s}", bm, bn, 32 * wm * wn * wk)


def sweep_entry(config: tuple[int, ...]) -> str:
    tile = sweep_tile(config)
    return (
        f'\nextern "C" __global__ void __launch_bounds__({tile.threads}) {tile.name}(const half_t* x, '
        "const half_t* w, const void* bias, half_t* out, unsigned int batch, unsigned int m, unsigned int n, "
        "unsigned int k, unsigned int x_stride, unsigned int w_stride, unsigned int wt, unsigned int epilogue) {\n"
        f"    matmul_tc<{', '.join(map(str, config))}>"
        "(x, w, bias, out, batch, m, n, k, x_stride, w_stride, wt, epilogue);\n}\n"
    )


def sweep_source(base: str, config: tuple[int, ...]) -> str:
    """The library's source up to its entry points (a quicker build), and the variant's entry point."""
    return (base[: base.index(ENTRIES)] if ENTRIES in base else base) + sweep_entry(config)


def grid(bm: int, bn: int, batch: int, m: int, n: int) -> tuple[int, int, int]:
    """One block per tile, folded into y past 65,535 (tc_grid's rule)."""
    tiles = -(-m // bm) * -(-n // bn)
    return (tiles, 1, batch) if tiles <= MAX_GROUPS else (MAX_GROUPS, -(-tiles // MAX_GROUPS), batch)


def load_protocol() -> Any:
    """gpud_protocol.ops.matmul; if the package's other modules do not import (others' work in
    progress), matmul.py alone over a stand-in for what it takes from gpud_protocol.ops."""
    sys.path.insert(0, str(ROOT / "protocol"))
    try:
        return importlib.import_module("gpud_protocol.ops.matmul")
    except Exception as exc:
        print(f"gpud_protocol does not import ({exc!r}): loading {PROTOCOL.name} alone")
    for name in [n for n in sys.modules if n.startswith("gpud_protocol")]:
        del sys.modules[name]

    class OpError(ValueError):
        pass

    def need(condition: bool, message: str) -> None:
        if not condition:
            raise OpError(message)

    class TensorInfo(NamedTuple):
        dtype: str
        shape: tuple[int, ...]

        @property
        def size(self) -> int:
            return math.prod(self.shape)

    @dataclasses.dataclass(frozen=True)
    class KernelSpec:
        name: str
        family: str
        op: str
        tensors: tuple[str, ...]
        writes: tuple[int, ...]
        scalars: tuple[tuple[str, str], ...]
        check: Any
        block: int = 256

    package, ops = types.ModuleType("gpud_protocol"), types.ModuleType("gpud_protocol.ops")
    package.__path__, ops.__path__ = [], []
    ops.__dict__.update(MAX_GROUPS=MAX_GROUPS, OpError=OpError, need=need, TensorInfo=TensorInfo, KernelSpec=KernelSpec)
    sys.modules.update({"gpud_protocol": package, "gpud_protocol.ops": ops})
    spec = importlib.util.spec_from_file_location("gpud_protocol.ops.matmul", PROTOCOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def compile_cubin(source: str, arch: str) -> bytes:
    """NVRTC, as gpud's CUDA backend calls it (no includes, the device's own architecture)."""
    from cuda.bindings import nvrtc

    status, program = nvrtc.nvrtcCreateProgram(source.encode(), b"matmul.cu", 0, [], [])
    assert not status, status
    try:
        options = [f"--gpu-architecture={arch}".encode()]
        (status,) = nvrtc.nvrtcCompileProgram(program, len(options), options)
        if status:
            size = nvrtc.nvrtcGetProgramLogSize(program)[1]
            log = bytearray(size)
            nvrtc.nvrtcGetProgramLog(program, log)
            raise RuntimeError("NVRTC: " + log.decode(errors="replace"))
        getter, sizer = (
            (nvrtc.nvrtcGetCUBIN, nvrtc.nvrtcGetCUBINSize)
            if arch.startswith("sm_")
            else (nvrtc.nvrtcGetPTX, nvrtc.nvrtcGetPTXSize)
        )
        image = bytearray(sizer(program)[1])
        getter(program, image)
        return bytes(image)
    finally:
        nvrtc.nvrtcDestroyProgram(program)


def build_images(arch: str, sweep: list[tuple[int, ...]]) -> list[bytes]:
    """The library's source, then one program per sweep variant (it appended), compiled in parallel."""
    base = with_preludes(SOURCE)
    sources = [base] + [sweep_source(base, config) for config in sweep]
    context = multiprocessing.get_context("spawn")  # the workers run NVRTC only, never CUDA
    with ProcessPoolExecutor(max_workers=min(16, len(sources)), mp_context=context) as pool:
        return list(pool.map(compile_cubin, sources, [arch] * len(sources)))


@dataclasses.dataclass
class Kernel:
    name: str
    bm: int
    bn: int
    threads: int
    function: Any
    regs: int = 0
    local: int = 0
    smem: int = 0
    shared: int = 0  # dynamic shared memory the launch gives

    def info(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "function"}


def _check(result: Any) -> Any:
    status, *rest = result if isinstance(result, tuple) else (result,)
    if int(status) != 0:
        raise RuntimeError(f"CUDA error {status!r}")
    return rest[0] if len(rest) == 1 else (rest or None)


class Device:
    def __init__(self) -> None:
        import torch
        from cuda.bindings import driver, nvrtc

        torch.cuda.init()
        torch.zeros(1, device="cuda")
        self.torch, self.cu = torch, driver
        _check(driver.cuInit(0))
        self.context = _check(driver.cuDevicePrimaryCtxRetain(_check(driver.cuDeviceGet(0))))
        _check(driver.cuCtxSetCurrent(self.context))
        props = torch.cuda.get_device_properties(0)
        self.name, self.sms, self.l2 = props.name, props.multi_processor_count, props.L2_cache_size
        cc = props.major * 10 + props.minor
        supported = list(_check(nvrtc.nvrtcGetSupportedArchs()))
        self.arch = f"sm_{cc}" if cc in supported else f"compute_{max(a for a in supported if a < cc)}"
        self.modules: list[Any] = []
        self.keep: list[Any] = []

    def build(self, production: list[Tile], sweep: list[tuple[int, ...]]) -> list[Kernel]:
        """The library's source as is (its matmul_tc kernels), and one program per sweep variant."""
        images = build_images(self.arch, sweep)
        groups = [(images[0], production)] + [(img, [sweep_tile(c)]) for img, c in zip(images[1:], sweep, strict=True)]
        kernels = []
        attr = self.cu.CUfunction_attribute
        for image, tiles in groups:
            module = _check(self.cu.cuModuleLoadData(image))
            self.modules.append(module)
            for tile in tiles:
                function = _check(self.cu.cuModuleGetFunction(module, tile.name.encode()))
                most = _check(self.cu.cuFuncGetAttribute(attr.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, function))
                assert most >= tile.threads, (tile, most)
                kernels.append(
                    Kernel(
                        *tile,
                        function,
                        _check(self.cu.cuFuncGetAttribute(attr.CU_FUNC_ATTRIBUTE_NUM_REGS, function)),
                        _check(self.cu.cuFuncGetAttribute(attr.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, function)),
                        _check(self.cu.cuFuncGetAttribute(attr.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, function)),
                    )
                )
        return kernels

    def place(self, array: np.ndarray, offset: int) -> int:
        """`array` on the device `offset` elements past a 256-byte boundary; its address."""
        torch = self.torch
        flat = torch.from_numpy(np.ascontiguousarray(array).ravel())
        buf = torch.empty(flat.numel() + offset + 8, dtype=flat.dtype, device="cuda")
        buf[offset : offset + flat.numel()] = flat.cuda()
        self.keep.append(buf)
        return int(buf.data_ptr()) + offset * int(flat.element_size())

    def launch(self, fn: Kernel, batch: int, m: int, n: int, pointers: list[int], scalars: list[int]) -> None:
        self.launch_grid(fn, grid(fn.bm, fn.bn, batch, m, n), pointers, scalars)

    def launch_grid(self, fn: Kernel, g: tuple[int, int, int], pointers: list[int], scalars: list[int]) -> None:
        slots = (ctypes.c_uint64 * (len(pointers) + len(scalars)))(*pointers, *scalars)
        base = ctypes.addressof(slots)
        params = (ctypes.c_void_p * len(slots))(*(base + 8 * i for i in range(len(slots))))
        stream = self.cu.CUstream(self.torch.cuda.current_stream().cuda_stream)
        _check(
            self.cu.cuLaunchKernel(fn.function, *g, fn.threads, 1, 1, fn.shared, stream, ctypes.addressof(params), 0)
        )

    def graph_time(self, call: Any, launches: int, reps: int) -> list[float]:
        """Seconds per call: `launches` calls (call(i)) in one CUDA graph, replayed `reps` times."""
        torch = self.torch
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            call(0)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(launches):
                call(i)
        graph.replay()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        samples = []
        for _ in range(reps):
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3 / launches)
        del graph
        return samples


def write_result(path: Path | None, result: dict[str, Any]) -> None:
    """A harness's results as JSON at `path` (its --json), where one is given."""
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {path}")

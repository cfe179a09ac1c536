"""wg_harness --ws: the warp-specialized kernels of benchmarks/ws_matmul.cu, built and launched.

ws_matmul.cu is appended to gpud/ops/matmul_wg.cu's source up to its entry points (the preludes first,
as gemm_device.with_preludes puts them, then wgmma.cu) with one entry point per VARIANTS row, compiled
for sm_90a. (Their persistent TMA variant, first measured here, is the library's: gpud/ops/matmul_tma.cu,
measured by `gpud bench ops`.)
ws_cpasync kernels take matmul_wg's parameters and launch as it does. ws_tma kernels take two tensor
maps (CUtensorMap: 128 bytes, 64-byte aligned, `const __grid_constant__`) in place of x and w, which
WsDevice encodes for each launch's pointers and sizes (cached; gpud.backends.cuda.tma.encode, the
daemon's own encoder). It launches through kernelParams, one pointer per parameter, not
`extra`: the driver takes each parameter's offset, size and alignment from the cubin, so the 64-byte
alignment of the maps and the packing of the 4-byte scalars after the pointers need no layout of
ours, and the array of pointers passes through cuda-bindings as gemm_device.Device.launch_grid's does.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

VARIANTS = [  # (operand path, BN, stages): BM 128 (2 consumer warpgroups of 64 rows), 384 threads
    ("cpasync", 128, 5),
    ("cpasync", 256, 4),
    ("tma", 128, 5),
    ("tma", 256, 4),
]
BM, THREADS = 128, 384
EDGES = [  # more than gemm_harness.EDGES: 9 x 6 tiles of 128 x 128 (a group of 8 rows of tiles and a partial one)
    (1, 1100, 700, 520, 1, 2, 0, 0, False),
    (1, 384, 520, 64, 1, 1, 0, 0, False),
]


def name(kind: str, bn: int, stages: int) -> str:
    return f"ws_{kind}{BM}x{bn}_s{stages}"


def shared(bn: int, stages: int) -> int:
    """Dynamic shared memory: the stages, their 2 mbarriers each, 1 KB to align the stages."""
    return stages * (BM + bn) * 128 + 16 * stages + 1024


def entry(kind: str, bn: int, stages: int) -> str:
    scalars = (
        "const void* bias, u16* out, unsigned int batch, unsigned int m, unsigned int n, unsigned int k, "
        "unsigned int x_stride, unsigned int w_stride, unsigned int wt, unsigned int bias_kind"
    )
    args = "bias, out, batch, m, n, k, x_stride, w_stride, bias_kind"
    if kind == "tma":
        params = "const __grid_constant__ TmaMap tx, const __grid_constant__ TmaMap tw, " + scalars
        call = f"ws_matmul<{bn}, {stages}, true>(&tx, &tw, nullptr, nullptr, {args});"
    else:
        params = "const u16* x, const u16* w, " + scalars
        call = f"ws_matmul<{bn}, {stages}, false>(nullptr, nullptr, x, w, {args});"
    return (
        f'\nextern "C" __global__ void __launch_bounds__({THREADS}, 1) {name(kind, bn, stages)}({params}) {{\n'
        f"    gpud_wait_prior();\n    {call}\n}}\n"
    )


def source(gd: Any, variants: list[tuple[str, int, int]]) -> str:
    """The program: the preludes, matmul_wg.cu without its entry points, ws_matmul.cu, the variants'."""
    ops = gd.ROOT / "gpud" / "ops"
    base: str = gd.with_preludes(ops / "wgmma.cu") + (ops / "matmul_wg.cu").read_text()  # wgmma.cu: desc(), wgmma_*
    base = base[: base.index(gd.ENTRIES)]
    text = base + Path(__file__).with_name("ws_matmul.cu").read_text()
    return text + "".join(entry(*variant) for variant in variants)


def build(dev: Any, gd: Any) -> list[Any]:
    """The VARIANTS as gemm_device.Kernel rows, loaded into dev's context."""
    variants = VARIANTS
    module = gd._check(dev.cu.cuModuleLoadData(gd.compile_cubin(source(gd, variants), "sm_90a")))
    dev.modules.append(module)
    attr = dev.cu.CUfunction_attribute
    kernels = []
    for kind, bn, stages in variants:
        fn = gd._check(dev.cu.cuModuleGetFunction(module, name(kind, bn, stages).encode()))
        size = shared(bn, stages)
        gd._check(dev.cu.cuFuncSetAttribute(fn, attr.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, size))
        regs = gd._check(dev.cu.cuFuncGetAttribute(attr.CU_FUNC_ATTRIBUTE_NUM_REGS, fn))
        local = gd._check(dev.cu.cuFuncGetAttribute(attr.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, fn))
        static = gd._check(dev.cu.cuFuncGetAttribute(attr.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, fn))
        kernels.append(gd.Kernel(name(kind, bn, stages), BM, bn, THREADS, fn, regs, local, static, size))
    return kernels


def tma_ok(case: tuple[Any, ...]) -> bool:
    """Whether ws_tma takes an edge case: K % 8 == 0 (rows 16-byte multiples), x and w 16-byte aligned."""
    _batch, _m, _n, k, _wt, _bias, x_off, w_off, _batched = case
    return bool(k % 8 == 0 and x_off == 0 and w_off == 0)


def edge_cases(kernel_name: str, edges: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """The edge cases (w as (N, K)) of one kernel: all of them for ws_cpasync, tma_ok's for ws_tma."""
    cases = [case for case in [*edges, *EDGES] if case[4] == 1]
    return [case for case in cases if tma_ok(case)] if kernel_name.startswith("ws_tma") else cases


class WsDevice:
    """gemm_device.Device with ws_tma launches: everything else is the wrapped device's."""

    def __init__(self, dev: Any, gd: Any) -> None:
        self.dev, self.gd = dev, gd
        self.maps: dict[tuple[int, int, int, int], tuple[Any, int]] = {}  # key: (its buffer, its address)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.dev, attr)

    def launch(self, fn: Any, batch: int, m: int, n: int, pointers: list[int], scalars: list[int]) -> None:
        self.launch_grid(fn, self.gd.grid(fn.bm, fn.bn, batch, m, n), pointers, scalars)

    def tensor_map(self, address: int, rows: int, k: int, box_rows: int) -> int:
        """The address of a tensor map (kept in self.maps) of a (rows, K) float16 matrix, encoded as the
        daemon encodes the library's (gpud.backends.cuda.tma), copied 64-byte aligned."""
        from gpud.backends.cuda import tma

        key = (address, rows, k, box_rows)
        if key not in self.maps:
            if address % 16 or k % 8:
                raise ValueError(f"TMA needs a 16-byte aligned matrix and K % 8 == 0: {address:#x}, K {k}")
            layout = tma.layout("matmul_tma128x128_f16_f16")  # a float16 map's element type
            assert layout is not None
            encoded = tma.encode(address, rows, k, box_rows, layout.data_type)
            buf = (ctypes.c_uint8 * (tma.MAP_BYTES + 64))()
            aligned = (ctypes.addressof(buf) + 63) & ~63
            ctypes.memmove(aligned, encoded, tma.MAP_BYTES)
            self.maps[key] = (buf, aligned)
        return int(self.maps[key][1])

    def launch_grid(self, fn: Any, g: tuple[int, int, int], pointers: list[int], scalars: list[int]) -> None:
        if not fn.name.startswith("ws_tma"):
            self.dev.launch_grid(fn, g, pointers, scalars)
            return
        x, w, bias, out = pointers
        batch, m, n, k, x_stride, w_stride = scalars[:6]
        if x_stride % k or w_stride % k:
            raise ValueError(f"{fn.name}: batch strides {x_stride}, {w_stride} not whole rows of K {k}")
        # a batch's rows follow the last batch's: rows past m (or n) of one batch read the next batch's
        # or zeros, and only reach out's rows (columns) past m (n), which are never stored
        tx = self.tensor_map(x, (batch - 1) * (x_stride // k) + m, k, BM)
        tw = self.tensor_map(w, (batch - 1) * (w_stride // k) + n, k, fn.bn)
        slots = (ctypes.c_uint64 * (2 + len(scalars)))(bias, out, *scalars)
        base = ctypes.addressof(slots)
        params = (ctypes.c_void_p * (4 + len(scalars)))(tx, tw, *(base + 8 * i for i in range(2 + len(scalars))))
        stream = self.dev.cu.CUstream(self.dev.torch.cuda.current_stream().cuda_stream)
        self.gd._check(
            self.dev.cu.cuLaunchKernel(
                fn.function, *g, fn.threads, 1, 1, fn.shared, stream, ctypes.addressof(params), 0
            )
        )

"""Matrix products on Hopper's warpgroup tensor cores (CUDA, compute capability 9.0; family
matmul_wg: gpud/ops/matmul_wg.cu, compiled for sm_90a).

`matmul_wg<BM>x<BN>_<t>_<t>` for t in f16, bf16: matmul's tensors, scalars and rule (see
gpud_protocol.ops.matmul) for x and w of one dtype, float16 or bfloat16, w as (N, K) only (wt = 1,
a Linear's weight); out in that dtype, float32 accumulators, rounded once. A block of
WG_TILES[name].threads threads computes a BM x BN tile of out through a pipeline in
WG_TILES[name].shared bytes of dynamic shared memory. Grid: wg_grid, one block per tile, their count
folded into y past 65,535 (the block's tile is blockIdx.x + blockIdx.y * gridDim.x; blocks past the
last tile do nothing), z the batch. wg_kernel picks the tile for a product, or None where matmul_tc
serves it better (few rows, or a weight as (K, N)).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import NamedTuple

from gpud_protocol.ops import KernelSpec, TensorInfo, need
from gpud_protocol.ops.matmul import SPECS as MATMUL_SPECS
from gpud_protocol.ops.matmul import fold, with_activation

SHORT = {"float16": "f16", "bfloat16": "bf16"}
CAPABILITY = "9.0"  # the devices (compute_capability in their info) that run these kernels
MIN_ROWS = 64  # fewer rows of x per weight matrix: matmul_tc's 16-row tiles waste less
MIN_TILES = 56  # fewer 64 x 64 tiles than this: matmul_tc's small tiles keep more multiprocessors busy


class WgTile(NamedTuple):
    bm: int
    bn: int
    stages: int
    blocks: int  # blocks per multiprocessor the kernel is built for (__launch_bounds__)

    @property
    def threads(self) -> int:
        return 2 * self.bm  # a warpgroup of 128 threads per 64 rows

    @property
    def shared(self) -> int:
        """Dynamic shared memory: `stages` K-slices of 64 elements of both tiles, and 1 KB to align them."""
        return self.stages * (self.bm + self.bn) * 128 + 1024


TILES = {  # "d": a deeper pipeline, for long K
    "128x256": WgTile(128, 256, 4, 1),
    "128x64": WgTile(128, 64, 4, 2),
    "64x64": WgTile(64, 64, 4, 3),
    "64x64d": WgTile(64, 64, 6, 2),
}
WG_TILES = {f"matmul_wg{size}_{t}_{t}": tile for t in SHORT.values() for size, tile in TILES.items()}
_TILED = {spec.name: spec for spec in MATMUL_SPECS}
SMS = 132  # the multiprocessors of the GPU the tile choice was fitted on (an H100)


def _tiles(tile: WgTile, m: int, n: int) -> int:
    return -(-m // tile.bm) * -(-n // tile.bn)


def wg_kernel(m: int, n: int, k: int, dtype: str) -> str | None:
    """The matmul_wg kernel for an (m, k) @ (k, n) product of `dtype` operands, or None where
    matmul_tc serves it better (too few tiles to fill the GPU). Fitted on an H100's measurements
    (benchmarks/wg_harness.py): 128 x 256 tiles for wide or deep products that still fill the GPU
    (at most one block per multiprocessor), 128 x 64 where there are 1.5 blocks per multiprocessor
    for them, else 64 x 64: with 6 pipeline stages where its tiles fit two blocks per multiprocessor in
    one wave, else 4 (three blocks per multiprocessor). The thresholds MIN_ROWS, MIN_TILES and the 6
    stages' were refitted on every kernel at every point of README's table (h100/session8/gemm-sweep.json:
    e.g. MiniLM's qkv at 256 rows 0.66 -> 0.78x cuBLAS, Qwen's k/v at 4,096 rows 0.61 -> 0.76)."""
    if dtype not in SHORT or m < MIN_ROWS or _tiles(TILES["64x64"], m, n) < MIN_TILES:
        return None
    t = SHORT[dtype]
    big = _tiles(TILES["128x256"], m, n)
    if (n >= 2048 and big >= 2 * SMS) or (k >= 2048 and 2 * big >= SMS):
        return f"matmul_wg128x256_{t}_{t}"
    if 2 * _tiles(TILES["128x64"], m, n) >= 3 * SMS:
        return f"matmul_wg128x64_{t}_{t}"
    deep = _tiles(TILES["64x64"], m, n) <= 2 * SMS
    return f"matmul_wg64x64{'d' if deep else ''}_{t}_{t}"


def wg_grid(name: str, batch: int, m: int, n: int) -> tuple[int, int, int]:
    """One block per tile, folded into y past 65,535; z the batch."""
    return fold(_tiles(WG_TILES[name], m, n), batch)


def _spec(name: str, tile: WgTile, dtype: str) -> KernelSpec:
    """matmul_<t>_<t>'s interface and rule, for w as (N, K) only."""
    tiled = _TILED[f"matmul_{SHORT[dtype]}_{SHORT[dtype]}"]

    def check(t: Sequence[TensorInfo], s: Sequence[int | float]) -> None:
        need(s[6] == 1, f"takes w as (N, K) only (wt 1), not wt {s[6]}")
        tiled_check(t, s)

    tiled_check = with_activation(tiled.check)
    return dataclasses.replace(
        tiled, name=name, family="matmul_wg", check=check, block=tile.threads, shared=tile.shared
    )


BACKENDS = ("cuda",)  # the backends whose sources have these kernels

SPECS = [
    _spec(name, tile, dtype)
    for dtype, t in SHORT.items()
    for name, tile in WG_TILES.items()
    if name.endswith(f"_{t}_{t}")
]

"""Matrix products on Hopper by TMA and warp-specialized warpgroups (CUDA, compute capability 9.0;
family matmul_tma: gpud/ops/matmul_tma.cu, compiled for sm_90a).

`matmul_tma<BM>x<BN>[pp]_<t>_<t>` (TMA_TILES: 128 x 128, 128 x 64, 128 x 128 ping-pong and 192 x 128)
for t in f16, bf16: matmul's tensors, scalars and rule (see gpud_protocol.ops.matmul) for x and w of one
dtype, float16 or bfloat16, w as (N, K) only (wt = 1), and further K % 8 == 0, x_stride and w_stride
multiples of K where batch > 1, and x and w at offsets of whole 16 bytes; out in that dtype, float32
accumulators, rounded once. The kernel's parameters are matmul_wg's except that x and w are CUDA tensor
maps (CUtensorMap, 128 bytes, `const __grid_constant__`), which the daemon encodes from the tensors it
binds there:

    x's map: rank 2, K-major, the (rows_x, K) matrix at x's address, box BOX_K (K) x BM rows;
    w's map: the same for the (rows_w, K) matrix at w's address, box BOX_K x BN;
    (rows_x, rows_w) = tma_rows(batch, m, n, k, x_stride, w_stride): batch b's rows start
    b * stride / K rows in; both with the 128-byte swizzle, L2 promotion 256 B, out-of-bounds
    elements filled with zeros, element type float16 or bfloat16 (the kernel's).

A block of TMA_TILES[name].threads threads (one producer warpgroup issuing the copies, and a consumer
warpgroup per 64 rows of the tile: two for BM = 128, three for BM = 192; or with `pingpong` two, each
taking every other tile whole, one's epilogue beside the other's products) walks tiles of BM x BN of out,
in TMA_TILES[name].shared bytes of dynamic shared memory.
Grid: tma_grid, (min(tiles, SMS), 1, batch): a block per multiprocessor at most, each taking every
gridDim.x-th tile (blocks past the last tile, or with y > 0, do nothing). The family's split-K kernels,
for few tiles and a long K, are gpud_protocol.ops.matmul_tmak's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import NamedTuple

from gpud_protocol.ops import Check, KernelSpec, TensorInfo, need
from gpud_protocol.ops.matmul import SPECS as MATMUL_SPECS
from gpud_protocol.ops.matmul import TC_FEW_ROWS, with_activation

SHORT = {"float16": "f16", "bfloat16": "bf16"}
CAPABILITY = "9.0"  # the devices (compute_capability in their info) that run these kernels
SMS = 132  # the multiprocessors of the GPU the kernels were measured on (an H100): the grid's most blocks
BOX_K = 64  # elements of K in a box of either tensor map (one 128-byte swizzled row)
ALIGN = 8  # elements: x and w start on 16 bytes, and K % ALIGN == 0 keeps every row on 16 bytes
MIN_TILES = 20  # fewer tiles: matmul_wg's smaller ones keep more multiprocessors busy
MIN_WORK = 60_000  # tiles x K below this: the persistent pipeline's fill costs more than it saves
NARROW_TILES = 72  # 128 x 64 tiles: at least this many (and one wave at most) ...
NARROW_K = 768  # ... and K this long (h100/session8/gemm-sweep.json)
PINGPONG_TILES = 800  # 128 x 128 tiles: from this many (6 a block or more) ...
PINGPONG_K = 1024  # ... and K this short, the ping-pong tiles (the same sweep, with them)
WIDE_ROWS = 1024  # 192 x 128 tiles: from this many rows, one product (not a batch) ...
WIDE_TILES = (180, 760)  # ... of this many of them, more than a wave and a third (h200x2/session9/gemm-sweep.json) ...
WIDE_K = 384  # ... with K this short, or
WIDE_FEW = 264  # ... at most two waves with any K


class TmaTile(NamedTuple):
    bm: int
    bn: int
    stages: int
    threads: int = 384  # a producer warpgroup and a consumer warpgroup per 64 rows (ping-pong: two)
    pingpong: bool = False  # each consumer warpgroup takes every other tile whole (matmul_tma_pp)

    @property
    def shared(self) -> int:
        """Dynamic shared memory: the stages (K-slices of BOX_K elements of both tiles), the staging
        buffer of the tile of out (BM rows of BN + 8 halves, in whole KB; ping-pong: one per consumer),
        two 8-byte mbarriers per stage (ping-pong: and the consumers' two turns), and 1 KB to align the
        stages."""
        staging = -(-self.bm * (self.bn + 8) * 2 // 1024) * 1024
        if self.pingpong:
            return self.stages * (self.bm + self.bn) * 2 * BOX_K + 2 * staging + 16 * self.stages + 16 + 1024
        return self.stages * (self.bm + self.bn) * 2 * BOX_K + staging + 16 * self.stages + 1024


TILES = {  # as measured on an H100 (wider tiles gained nothing past noise)
    "128x128": TmaTile(128, 128, 5),
    "128x64": TmaTile(128, 64, 8),  # twice the tiles, for products of few 128 x 128 ones
    # ping-pong: one consumer's epilogue beside the other's products; two staging buffers leave room
    # for 4 stages
    "128x128pp": TmaTile(128, 128, 4, pingpong=True),
    # three consumer warpgroups, cuBLAS's tile for MiniLM's products (K = 384): 1.2x the products per byte
    # staged of 128 x 128, a tile's epilogue beside 1.5x the products; 4 stages of 40 KB beside the 51 KB
    # staging buffer (217,152 bytes: a fifth would not fit)
    "192x128": TmaTile(192, 128, 4, threads=512),
}
TMA_TILES = {f"matmul_tma{size}_{t}_{t}": tile for t in SHORT.values() for size, tile in TILES.items()}
_TILED = {spec.name: spec for spec in MATMUL_SPECS}


def tma_kernel(batch: int, m: int, n: int, k: int, dtype: str) -> str | None:
    """The matmul_tma kernel for `batch` products (m, k) @ (n, k)^T of `dtype` operands, or None where
    matmul_wg or matmul_tc serves them better or K is not a multiple of ALIGN. Fitted on an H100
    (the experiment of commit 867701f, h100/session6/wg-ws-persistent.json: Qwen2.5-0.5B's and
    MiniLM's layers, M from 256 to 15,360): it beat matmul_wg at every point with at least MIN_TILES
    tiles and MIN_WORK tiles x K, and lost or tied at every other; up to TC_FEW_ROWS rows matmul_tc's
    16 x 16 tiles beat it even on an LM head's 1,187 tiles (h100/session8/gemm-sweep.json). 128 x 64
    tiles where they make one wave of NARROW_TILES to SMS tiles at full 128 rows and K of NARROW_K or more:
    there they beat every other kernel (the same sweep: Qwen's q/o at 1,024 rows 0.67 -> 0.82x cuBLAS,
    gate/up at 128 rows 0.66 -> 0.78, down at 1,024 rows 0.70 -> 0.77), and lost wherever a wave was
    partly empty or tiles were left for a second one. The ping-pong form of the 128 x 128 tiles from
    PINGPONG_TILES tiles with K up to PINGPONG_K, where each block has several tiles whose epilogues
    it can hide (h100/session8/gemm-sweep-pingpong.json: Qwen's gate/up at 4,096 rows 0.83 -> 0.87x,
    the LM head at 1,024 rows 0.85 -> 0.90, MiniLM's qkv at 15,360 rows 0.78 -> 0.81; it lost with
    K = 4,864 and with few tiles a block). The 192 x 128 tiles for one product of WIDE_ROWS rows or more
    in WIDE_TILES of them, with K up to WIDE_K or in WIDE_FEW tiles at most (h200x2/session9/gemm-sweep.json,
    two H200s' first: MiniLM's qkv at 15,360 rows 0.79 -> 0.82x cuBLAS, its attention output 0.75 -> 0.79,
    FFN up at 4,096 rows 0.75 -> 0.80, down at 15,360 0.87 -> 0.89, Qwen's gate/up at 1,024 rows 0.74 ->
    0.77; they lost to the ping-pong tiles from about 800 of them, or with K = 896 at 560, and wherever a
    second wave was mostly empty)."""
    if dtype not in SHORT or k % ALIGN or m <= TC_FEW_ROWS:
        return None
    t = SHORT[dtype]
    if narrow(batch, m, n, k):
        return f"matmul_tma128x64_{t}_{t}"
    if wide(batch, m, n, k):
        return f"matmul_tma192x128_{t}_{t}"
    tiles = tiles_of(TILES["128x128"], batch, m, n)
    if tiles < MIN_TILES or tiles * k < MIN_WORK:
        return None
    if tiles >= PINGPONG_TILES and k <= PINGPONG_K:
        return f"matmul_tma128x128pp_{t}_{t}"
    return f"matmul_tma128x128_{t}_{t}"


def tiles_of(tile: TmaTile, batch: int, m: int, n: int) -> int:
    return batch * -(-m // tile.bm) * -(-n // tile.bn)


def narrow(batch: int, m: int, n: int, k: int) -> bool:
    """Whether the 128 x 64 tiles serve these products (see tma_kernel)."""
    return m >= TILES["128x64"].bm and k >= NARROW_K and NARROW_TILES <= tiles_of(TILES["128x64"], batch, m, n) <= SMS


def wide(batch: int, m: int, n: int, k: int) -> bool:
    """Whether the 192 x 128 tiles serve these products (see tma_kernel)."""
    tiles = tiles_of(TILES["192x128"], batch, m, n)
    low, high = WIDE_TILES
    return batch == 1 and m >= WIDE_ROWS and low <= tiles <= high and (k <= WIDE_K or tiles <= WIDE_FEW)


def tma_grid(name: str, batch: int, m: int, n: int) -> tuple[int, int, int]:
    """A block per tile up to one per multiprocessor (SMS), z the batch."""
    tile = TMA_TILES[name]
    return (min(-(-m // tile.bm) * -(-n // tile.bn), SMS), 1, batch)


def tma_rows(batch: int, m: int, n: int, k: int, x_stride: int, w_stride: int) -> tuple[int, int]:
    """The rows (of K elements) of x's and of w's tensor map: the last batch's rows end the matrix."""
    return ((batch - 1) * x_stride // k + m, (batch - 1) * w_stride // k + n)


def tma_check(name: str, t: Sequence[TensorInfo], s: Sequence[int | float]) -> None:
    """What kernel `name`'s tensor maps need beyond matmul's rule (which the spec checks first): rows of
    16-byte multiples, batches of whole rows, x and w on 16 bytes."""
    batch, k, x_stride, w_stride = s[0], s[3], s[4], s[5]
    need(k % ALIGN == 0, f"{name} reads rows by TMA: K must be a multiple of {ALIGN}, not {k}")
    need(
        batch == 1 or (x_stride % k == 0 and w_stride % k == 0),
        f"{name} reads batches as rows: x_stride {x_stride} and w_stride {w_stride} must be multiples of K {k}",
    )
    for info, what in zip(t[:2], ("x", "w"), strict=True):
        need(
            info.offset % ALIGN == 0,
            f"{name} reads {what} by TMA from 16-byte boundaries: {what} is a view at element {info.offset}, "
            f"not a multiple of {ALIGN}",
        )


def tma_rule(name: str, dtype: str) -> Check:
    """Kernel `name`'s rule for x and w of `dtype`: matmul_<t>_<t>'s (an activation too), for w as (N, K)
    only, and tma_check's; refusals name the kernel."""
    tiled_check = with_activation(_TILED[f"matmul_{SHORT[dtype]}_{SHORT[dtype]}"].check)

    def check(t: Sequence[TensorInfo], s: Sequence[int | float]) -> None:
        need(s[6] == 1, f"{name} takes w as (N, K) only (wt 1), not wt {s[6]}")
        tiled_check(t, s)
        tma_check(name, t, s)

    return check


def _spec(name: str, tile: TmaTile, dtype: str) -> KernelSpec:
    """matmul_<t>_<t>'s interface, and tma_rule's rule."""
    tiled = _TILED[f"matmul_{SHORT[dtype]}_{SHORT[dtype]}"]
    return dataclasses.replace(
        tiled, name=name, family="matmul_tma", check=tma_rule(name, dtype), block=tile.threads, shared=tile.shared
    )


BACKENDS = ("cuda",)  # the backends whose sources have these kernels

SPECS = [
    _spec(name, tile, dtype)
    for dtype, t in SHORT.items()
    for name, tile in TMA_TILES.items()
    if name.endswith(f"_{t}_{t}")
]

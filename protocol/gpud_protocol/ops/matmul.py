"""Matrix products: out = x @ w (+ bias), products accumulated in float32.

x is (M, K) or batched (B, M, K); w is (K, N), or (N, K) with `wt` (PyTorch Linear's weight
layout), or batched (B, K, N) / (B, N, K); a 2-D operand is shared by every batch. out is (M, N),
or (B, M, N) when either operand is batched. Operands are float32 or float16 in any mix; out is
float16 when both are, else float32; bias (N,) is float32 or float16.

Kernels `matvec_<x>_<w>` (at most MATVEC_ROWS rows of x per weight matrix: decode) and
`matmul_<x>_<w>` (tiled, any M), for <x>, <w> in f32, f16. Every kernel takes
tensors (x, w, bias, out) and u32 scalars (batch, m, n, k, x_stride, w_stride, wt, bias_kind):

    out[b*m*n + i*n + j] = bias[j] + sum_t x[b*x_stride + i*k + t] * W[b*w_stride + (j*k + t if wt else t*n + j)]

for b < batch, i < m, j < n. bias_kind: 0 none (the bias tensor is not read; the client passes x),
1 float32, 2 float16. A 2-D w shared by a batched x folds the batches into the rows (batch 1,
m = B*M) so that each weight matrix is read once; the unfolded form (batch B, x_stride M*K,
w_stride 0) is accepted too.

Grids: matvec with wt: one workgroup of 256 threads per 256 / threads_per_row(k) rows of out; without
wt: one per MATVEC_COLS columns; either count is folded into y past 65,535 (the kernel's group is
gid.x + gid.y * groups.x); z is the batch. matmul: (ceil(n / TILE), ceil(m / TILE), batch).

CUDA only (family matmul_tc: gpud/ops/matmul_tc.cu): `matmul_tc<BM>x<BN>_f16_f16`, float16 x and w
on the tensor cores (float32 accumulators, out rounded to float16 once), the same tensors, scalars
and rule as matmul_f16_f16; a block of
TC_TILES[name].threads threads computes a BM x BN tile of out. Grid: tc_grid, one block per tile,
their count folded into y past 65,535 (the block's tile is blockIdx.x + blockIdx.y * gridDim.x;
blocks past the last tile do nothing), z the batch. tc_kernel picks the tile for a product; the
client uses these on the cuda backend only (the WebGPU sources have none of them) and keeps
matmul_<x>_<w> for float32 operands (float32 products, which float16 operands would round).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from gpud_protocol.ops import MAX_GROUPS, KernelSpec, TensorInfo, need

DTYPES = ("float32", "float16")
SHORT = {"float32": "f32", "float16": "f16"}
BIAS_KINDS = {"float32": 1, "float16": 2}  # bias_kind by the bias's dtype; 0: no bias
MATVEC_ROWS = 8  # the matvec kernels' most rows of x per weight matrix
MATVEC_COLS = 64  # matvec without wt: columns of out per workgroup
TILE = 64  # matmul: a workgroup computes a TILE x TILE block of out
BLOCK = 256  # threads per workgroup of every matmul kernel
SCALARS = tuple((name, "u32") for name in ("batch", "m", "n", "k", "x_stride", "w_stride", "wt", "bias_kind"))
LIMIT = 1 << 32  # elements per tensor: indices are u32 on WebGPU


class Plan(NamedTuple):
    """How a product of x and w is computed: out's shape and the kernel's first six scalars."""

    out_shape: tuple[int, ...]
    batch: int
    m: int
    n: int
    k: int
    x_stride: int
    w_stride: int

    @property
    def sizes(self) -> tuple[int, int, int, int, int, int]:
        return (self.batch, self.m, self.n, self.k, self.x_stride, self.w_stride)


def out_dtype(x_dtype: str, w_dtype: str) -> str:
    return "float16" if x_dtype == w_dtype == "float16" else "float32"


def plan(x_shape: Sequence[int], w_shape: Sequence[int], wt: bool) -> Plan:
    """The product's plan (shared w folded into the rows); OpError naming the mismatch."""
    xs, ws = tuple(x_shape), tuple(w_shape)
    need(len(xs) in (2, 3), f"x is (M, K) or (B, M, K), not {list(xs)}")
    need(len(ws) in (2, 3), f"w is {'(N, K)' if wt else '(K, N)'} or batched, not {list(ws)}")
    m, k = xs[-2:]
    n, kw = ws[-2:] if wt else ws[-2:][::-1]
    layout = "(N, K) (transpose_w)" if wt else "(K, N)"
    need(k == kw, f"x has K={k} but w {list(ws)} as {layout} has K={kw}")
    need(min(m, n, k) >= 1, f"empty product: M={m}, N={n}, K={k}")
    xb = xs[0] if len(xs) == 3 else None
    wb = ws[0] if len(ws) == 3 else None
    if xb is not None and wb is not None:
        need(xb == wb, f"batch counts differ: x has {xb}, w has {wb}")
    batch = xb if xb is not None else wb
    if batch is None:
        return Plan((m, n), 1, m, n, k, 0, 0)
    need(1 <= batch <= MAX_GROUPS, f"batch count {batch} is not in 1..{MAX_GROUPS}")
    if wb is None:  # one weight matrix for every batch: the batches are more rows
        return Plan((batch, m, n), 1, batch * m, n, k, 0, 0)
    return Plan((batch, m, n), batch, m, n, k, m * k if xb is not None else 0, n * k)


def threads_per_row(k: int) -> int:
    """matvec with wt: threads that share one row of w (a power of two, 32..256: ~32 elements each)."""
    t = 32
    while t < BLOCK and t * 32 < k:
        t *= 2
    return t


def _fold(groups: int, batch: int) -> tuple[int, int, int]:
    if groups <= MAX_GROUPS:
        return (groups, 1, batch)
    return (MAX_GROUPS, -(-groups // MAX_GROUPS), batch)


def matvec_grid(batch: int, n: int, k: int, wt: bool) -> tuple[int, int, int]:
    per_group = BLOCK // threads_per_row(k) if wt else MATVEC_COLS
    return _fold(-(-n // per_group), batch)


def matmul_grid(batch: int, m: int, n: int) -> tuple[int, int, int]:
    grid = (-(-n // TILE), -(-m // TILE), batch)
    need(max(grid) <= MAX_GROUPS, f"M={m}, N={n}, batch {batch}: more than {MAX_GROUPS} workgroups along an axis")
    return grid


class TcTile(NamedTuple):
    """A matmul_tc kernel's tile: rows and columns of out per block, and threads per block."""

    bm: int
    bn: int
    threads: int


TC_TILES: dict[str, TcTile] = {  # largest first
    "matmul_tc128x128_f16_f16": TcTile(128, 128, 256),
    "matmul_tc64x64_f16_f16": TcTile(64, 64, 128),
    "matmul_tc32x32_f16_f16": TcTile(32, 32, 128),
    "matmul_tc16x32_f16_f16": TcTile(16, 32, 128),
    "matmul_tc16x16_f16_f16": TcTile(16, 16, 256),
}
SMS = 132  # the multiprocessors of the GPU the tile choice was fitted on (an H100)
TC_BUSY = 1.5  # ... and the tiles per multiprocessor a larger tile must still give


def _tiles(name: str, m: int, n: int) -> int:
    t = TC_TILES[name]
    return -(-m // t.bm) * -(-n // t.bn)


def tc_kernel(m: int, n: int, k: int) -> str:
    """The matmul_tc kernel for an (m, k) @ (k, n) product. Up to 16 rows, 16 x 16 tiles (the product
    is bound by the latency of its K loop: many blocks, each with a deep pipeline); past that the
    largest tile of at most m rows that still gives TC_BUSY tiles per multiprocessor, else 16 x 16.
    Fitted on the measurements of benchmarks/gemm_harness.py --sweep (K does not enter yet)."""
    smallest = "matmul_tc16x16_f16_f16"
    if m <= 16:
        return smallest
    for name, tile in TC_TILES.items():
        if tile.bm <= m and _tiles(name, m, n) >= TC_BUSY * SMS:
            return name
    return smallest


def tc_grid(name: str, batch: int, m: int, n: int) -> tuple[int, int, int]:
    """One block per tile, folded into y past 65,535; z the batch."""
    return _fold(_tiles(name, m, n), batch)


def _spec(kind: str, x_dtype: str, w_dtype: str, block: int = BLOCK, family: str = "matmul") -> KernelSpec:
    result = out_dtype(x_dtype, w_dtype)

    def check(t: Sequence[TensorInfo], s: Sequence[int | float]) -> None:
        x, w, bias, out = t
        wt, bias_kind = s[6], s[7]
        need(
            (x.dtype, w.dtype) == (x_dtype, w_dtype),
            f"takes x {x_dtype} and w {w_dtype}, got x {x.dtype} and w {w.dtype}",
        )
        need(out.dtype == result, f"out is {out.dtype}, the product of {x_dtype} and {w_dtype} is {result}")
        need(wt in (0, 1), f"wt is 0 or 1, not {wt}")
        p = plan(x.shape, w.shape, bool(wt))
        need(out.shape == p.out_shape, f"out is {list(out.shape)}, the product is {list(p.out_shape)}")
        need(max(x.size, w.size, out.size) < LIMIT, f"more than {LIMIT - 1} elements in a tensor")
        forms = {p.sizes}
        if len(x.shape) == 3 and len(w.shape) == 2:  # shared w, batches not folded into the rows
            forms.add((p.out_shape[0], p.out_shape[1], p.n, p.k, p.out_shape[1] * p.k, 0))
        sizes = tuple(s[:6])
        need(sizes in forms, f"the sizes passed {list(sizes)} do not match the tensors (expected {sorted(forms)})")
        need(bias_kind in (0, 1, 2), f"bias_kind is 0, 1 or 2, not {bias_kind}")
        if bias_kind:
            want = "float32" if bias_kind == 1 else "float16"
            need(bias.dtype == want, f"bias_kind {bias_kind} is a {want} bias, the bias is {bias.dtype}")
            need(bias.shape == (p.n,), f"bias is {list(bias.shape)}, it must be [{p.n}] (N)")
        if kind == "matvec":
            need(s[1] <= MATVEC_ROWS, f"matvec takes at most {MATVEC_ROWS} rows of x per weight matrix, not {s[1]}")

    name = f"{kind}_{SHORT[x_dtype]}_{SHORT[w_dtype]}"
    return KernelSpec(name, family, "matmul", ("x", "w", "bias", "out"), (3,), SCALARS, check, block)


SPECS = [_spec(kind, xd, wd) for kind in ("matvec", "matmul") for xd in DTYPES for wd in DTYPES] + [
    _spec(name.removesuffix("_f16_f16"), "float16", "float16", tile.threads, "matmul_tc")
    for name, tile in TC_TILES.items()
]

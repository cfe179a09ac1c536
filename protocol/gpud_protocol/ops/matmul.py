"""Matrix products: out = act(x @ w (+ bias)), products accumulated in float32.

x is (M, K) or batched (B, M, K); w is (K, N), or (N, K) with `wt` (PyTorch Linear's weight
layout), or batched (B, K, N) / (B, N, K); a 2-D operand is shared by every batch. out is (M, N),
or (B, M, N) when either operand is batched. Operands are float32, float16 or bfloat16, in any mix
but float16 with bfloat16 (no kernel takes that pair, as torch refuses it: cast one); out is the
operands' dtype when they share it, else float32 (OUT: rounded once, to nearest even for bfloat16);
bias (N,) is float32, float16 or bfloat16.

Kernels `matvec_<x>_<w>` (at most MATVEC_ROWS rows of x per weight matrix: decode) and
`matmul_<x>_<w>` (tiled, any M), for the pairs (<x>, <w>) of PAIRS (f32, f16, bf16). Every kernel takes
tensors (x, w, bias, out) and u32 scalars (batch, m, n, k, x_stride, w_stride, wt, epilogue):

    out[b*m*n + i*n + j] = act(bias[j] + sum_t x[b*x_stride + i*k + t] * W[b*w_stride + (j*k + t if wt else t*n + j)])

for b < batch, i < m, j < n. epilogue = bias kind + 256 * activation. The bias kind: 0 none (the bias
tensor is not read; the client passes x), 1 float32, 2 float16, 3 bfloat16 (BIAS_KINDS). The
activation (ACTIVATIONS, ew_unary's codes): 0 none, 3 silu, 4 gelu (erf), 5 gelu (tanh), applied to
out as rounded, then rounded again: the bits of the product, then of ew_unary on it. Only the
warpgroup kernels (matmul_wg, matmul_tma: CUDA, Hopper) take an activation, applied as they store their
tiles; the client runs the unary op after the other kernels. A 2-D w shared by a batched x folds the batches into
the rows (batch 1, m = B*M) so that each weight matrix is read once; the unfolded form (batch B,
x_stride M*K, w_stride 0) is accepted too, and so are the rows of a shared w split into equal
groups of 4 to 8 (matvec_groups: how up to MATVEC_GROUPED rows go to matvec).

Grids: matvec with wt: one workgroup of 256 threads per 256 / threads_per_row(k) rows of out; without
wt: one per MATVEC_COLS columns; either count is folded into y past 65,535 (the kernel's group is
gid.x + gid.y * groups.x); z is the batch. matmul: (ceil(n / TILE), ceil(m / TILE), batch).

CUDA only (family matmul_tc: gpud/ops/matmul_tc.cu): `matmul_tc<BM>x<BN>_<t>_<t>` for <t> f16 and bf16
(TC_DTYPES), x and w both of that dtype on the tensor cores (mma.sync's float16 or bfloat16 form,
float32 accumulators, out rounded to x's dtype once), the same tensors, scalars and rule as
matmul_<t>_<t>; a block of TC_KERNELS[name].threads threads computes a BM x BN tile of out (TC_TILES:
the float16 names of the tiles, which the bfloat16 kernels share). Grid: tc_grid, one block per tile,
their count folded into y past 65,535 (the block's tile is blockIdx.x + blockIdx.y * gridDim.x;
blocks past the last tile do nothing), z the batch. tc_kernel picks the tile for a product; the
client uses these on the cuda backend only (the WebGPU sources have none of them) and keeps
matmul_<x>_<w> for the other pairs (float32 products, which 16-bit operands would round).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from gpud_protocol.ops import MAX_GROUPS, KernelSpec, TensorInfo, need

DTYPES = ("float32", "float16", "bfloat16")
SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}
BIAS_KINDS = {"float32": 1, "float16": 2, "bfloat16": 3}  # epilogue's low byte by the bias's dtype; 0: no bias
ACTIVATIONS = {"silu": 3, "gelu": 4, "gelu_tanh": 5}  # epilogue >> 8: ew_unary's op codes; 0: none
MATVEC_ROWS = 8  # the matvec kernels' most rows of x per weight matrix
MATVEC_GROUPED = 32  # up to this many rows of x, in equal groups of 4..8 (grid z), still go to matvec
MATVEC_COLS = 64  # matvec without wt: columns of out per workgroup
TILE = 64  # matmul: a workgroup computes a TILE x TILE block of out
BLOCK = 256  # threads per workgroup of every matmul kernel
SCALARS = tuple((name, "u32") for name in ("batch", "m", "n", "k", "x_stride", "w_stride", "wt", "epilogue"))
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


def mixes_halves(x_dtype: str, w_dtype: str) -> bool:
    """float16 with bfloat16: no kernel takes the pair (torch refuses it too); the caller casts one."""
    return {x_dtype, w_dtype} == {"float16", "bfloat16"}


PAIRS = tuple((x, w) for x in DTYPES for w in DTYPES if not mixes_halves(x, w))  # (x, w) dtypes with kernels


def out_dtype(x_dtype: str, w_dtype: str) -> str:
    return x_dtype if x_dtype == w_dtype else "float32"


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


def matvec_groups(p: Plan) -> Plan | None:
    """The plan that runs rows past MATVEC_ROWS through matvec, as equal groups of 4 to 8 rows along
    the grid's z (the unfolded form of one shared w), or None where the rows do not split so. Each row
    is then summed exactly as it would be alone (the order of a row's products does not depend on the
    rows beside it): a batch of sequences gives each one the bits it gets by itself, and w is read by
    every group, from L2 where it fits, instead of going through the tiled kernel's FMA tiles."""
    if p.batch != 1 or p.m > MATVEC_GROUPED:
        return None
    rows = next((r for r in range(MATVEC_ROWS, 3, -1) if p.m % r == 0), None)
    if rows is None:
        return None
    return Plan(p.out_shape, p.m // rows, rows, p.n, p.k, rows * p.k, 0)


def threads_per_row(k: int) -> int:
    """matvec with wt: threads that share one row of w (a power of two, 32..256: ~32 elements each)."""
    t = 32
    while t < BLOCK and t * 32 < k:
        t *= 2
    return t


def fold(groups: int, batch: int) -> tuple[int, int, int]:
    """A grid of `groups` workgroups (folded into y past 65,535) for each of `batch` batches."""
    if groups <= MAX_GROUPS:
        return (groups, 1, batch)
    return (MAX_GROUPS, -(-groups // MAX_GROUPS), batch)


def matvec_grid(batch: int, n: int, k: int, wt: bool) -> tuple[int, int, int]:
    per_group = BLOCK // threads_per_row(k) if wt else MATVEC_COLS
    return fold(-(-n // per_group), batch)


def matmul_grid(batch: int, m: int, n: int) -> tuple[int, int, int]:
    grid = (-(-n // TILE), -(-m // TILE), batch)
    need(max(grid) <= MAX_GROUPS, f"M={m}, N={n}, batch {batch}: more than {MAX_GROUPS} workgroups along an axis")
    return grid


class TcTile(NamedTuple):
    """A matmul_tc kernel's tile: rows and columns of out per block, and threads per block."""

    bm: int
    bn: int
    threads: int


TC_TILES: dict[str, TcTile] = {  # largest first; the float16 names (tc_name gives the others)
    "matmul_tc128x128_f16_f16": TcTile(128, 128, 256),
    "matmul_tc64x64_f16_f16": TcTile(64, 64, 128),
    "matmul_tc32x32_f16_f16": TcTile(32, 32, 128),
    "matmul_tc16x32_f16_f16": TcTile(16, 32, 128),
    "matmul_tc16x16_f16_f16": TcTile(16, 16, 256),
}
TC_DTYPES = {"float16": "f16", "bfloat16": "bf16"}  # the operands' dtype of each matmul_tc variant


def tc_name(name: str, dtype: str) -> str:
    """The variant of tile `name` (a TC_TILES key, or any variant's name) for x and w of `dtype`."""
    tile = name.removeprefix("matmul_tc").split("_")[0]
    short = TC_DTYPES[dtype]
    return f"matmul_tc{tile}_{short}_{short}"


TC_KERNELS: dict[str, TcTile] = {tc_name(n, d): t for d in TC_DTYPES for n, t in TC_TILES.items()}
SMS = 132  # the multiprocessors of the GPU the tile choice was fitted on (an H100)
TC_FEW_ROWS = 16  # up to this many rows, matmul_tc's 16 x 16 tiles beat every other kernel (an LM head too)
TC_BUSY = 1.5  # ... and the tiles per multiprocessor a larger tile must still give


def _tiles(name: str, m: int, n: int) -> int:
    t = TC_KERNELS[name]
    return -(-m // t.bm) * -(-n // t.bn)


def tc_kernel(m: int, n: int, k: int, dtype: str = "float16") -> str:
    """The matmul_tc kernel for an (m, k) @ (k, n) product of x and w of `dtype` (TC_DTYPES). Up to 16
    rows, 16 x 16 tiles (the product is bound by the latency of its K loop: many blocks, each with a
    deep pipeline); past that the largest tile of at most m rows that still gives TC_BUSY tiles per
    multiprocessor, else 16 x 16. Fitted on the measurements of benchmarks/gemm_harness.py --sweep
    (float16; K does not enter yet), and used for bfloat16 alike (the same instructions' rate)."""
    smallest = "matmul_tc16x16_f16_f16"
    if m <= TC_FEW_ROWS:
        return tc_name(smallest, dtype)
    for name, tile in TC_TILES.items():
        if tile.bm <= m and _tiles(name, m, n) >= TC_BUSY * SMS:
            return tc_name(name, dtype)
    return tc_name(smallest, dtype)


def tc_grid(name: str, batch: int, m: int, n: int) -> tuple[int, int, int]:
    """One block per tile, folded into y past 65,535; z the batch."""
    return fold(_tiles(name, m, n), batch)


def _spec(kind: str, x_dtype: str, w_dtype: str, block: int = BLOCK, family: str = "matmul") -> KernelSpec:
    result = out_dtype(x_dtype, w_dtype)

    def check(t: Sequence[TensorInfo], s: Sequence[int | float]) -> None:
        x, w, bias, out = t
        wt, epilogue = s[6], int(s[7])
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
        grouped = matvec_groups(p)
        if grouped is not None:  # the rows in equal groups along z (matvec_groups)
            forms.add(grouped.sizes)
        sizes = tuple(s[:6])
        need(sizes in forms, f"the sizes passed {list(sizes)} do not match the tensors (expected {sorted(forms)})")
        bias_kind = epilogue & 255
        need(bias_kind in (0, *BIAS_KINDS.values()), f"epilogue's bias kind is 0, 1, 2 or 3, not {bias_kind}")
        need(
            activation_of(epilogue) == 0,
            f"{name} applies no activation (epilogue {epilogue}): the warpgroup kernels (matmul_wg, matmul_tma) do",
        )
        if bias_kind:
            want = next(dtype for dtype, kind in BIAS_KINDS.items() if kind == bias_kind)
            need(bias.dtype == want, f"bias kind {bias_kind} is a {want} bias, the bias is {bias.dtype}")
            need(bias.shape == (p.n,), f"bias is {list(bias.shape)}, it must be [{p.n}] (N)")
        if kind == "matvec":
            need(s[1] <= MATVEC_ROWS, f"matvec takes at most {MATVEC_ROWS} rows of x per weight matrix, not {s[1]}")

    name = f"{kind}_{SHORT[x_dtype]}_{SHORT[w_dtype]}"
    return KernelSpec(name, family, "matmul", ("x", "w", "bias", "out"), (3,), SCALARS, check, block)


def activation_of(epilogue: int | float) -> int:
    """The activation code of an epilogue scalar (0: none), checked against ACTIVATIONS."""
    code = int(epilogue) >> 8
    need(code in (0, *ACTIVATIONS.values()), f"epilogue's activation is 0 or one of {ACTIVATIONS} (x 256), not {code}")
    return code


def with_activation(check: Callable[[Sequence[TensorInfo], Sequence[int | float]], None]) -> Any:
    """A kernel's rule that also takes an activation in its epilogue (the warpgroup kernels): `check` of the
    epilogue without it, the activation checked on its own."""

    def checked(t: Sequence[TensorInfo], s: Sequence[int | float]) -> None:
        activation_of(s[7])
        check(t, [*s[:7], int(s[7]) & 255, *s[8:]])

    return checked


SPECS = [_spec(kind, xd, wd) for kind in ("matvec", "matmul") for xd, wd in PAIRS] + [
    _spec(name.removesuffix(f"_{short}_{short}"), dtype, dtype, tile.threads, "matmul_tc")
    for dtype, short in TC_DTYPES.items()
    for name, tile in TC_KERNELS.items()
    if name.endswith(f"_{short}_{short}")
]

"""Split-K for the TMA matmuls on Hopper (family matmul_tma: gpud/ops/matmul_tma.cu, CUDA, compute
capability 9.0), for products of few tiles and a long K, which leave multiprocessors idle otherwise.

`matmul_tmak<S>_128x128_<t>_<t>` for S in SPLITS and t in f16, bf16: matmul_tma128x128_<t>_<t>'s tensors,
scalars and rule (x and w as tensor maps, which the daemon encodes; gpud_protocol.ops.matmul_tma), and
K of at least S slices of BOX_K. A cluster of S blocks (`__cluster_dims__(S, 1, 1)`: the hardware runs
them at once) computes a 128 x 128 tile of out: block s sums the products over K's slices of BOX_K from
s * ktiles // S to (s + 1) * ktiles // S - 1 (ktiles = ceil(K / BOX_K)) in float32, keeps the sums in its
shared memory, and after a cluster barrier sums rows s * 128 / S .. (s + 1) * 128 / S - 1 of the S
blocks' sums, in block order, from their shared memory; then out as matmul_tma stores it (bias, one
rounding, the activation). So out's bits depend on S (another order of the same float32 sums), never on
the order the blocks run in; no scratch in global memory, no second launch.
Grid: tmak_grid, (tiles x S, 1, batch): block x computes tile x // S with rank x % S in its cluster.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from gpud_protocol.ops import KernelSpec, TensorInfo, need
from gpud_protocol.ops.matmul_tma import ALIGN, BOX_K, SHORT, SMS, TILES, narrow, tiles_of, tma_rule
from gpud_protocol.ops.matmul_tma import SPECS as TMA_SPECS

SPLITS = (2, 4, 8)  # cluster sizes (8: the most a cluster takes without opting in)
TMAK_TILES = {
    f"matmul_tmak{splits}_{size}_{t}_{t}": tile
    for splits in SPLITS
    for t in SHORT.values()
    for size, tile in TILES.items()
    if size == "128x128"  # split-K is for products of few of these
}
# When the op splits K (tma_splits), fitted on an H100 (h100/session7/splitk-sweep.json: float16, N 896 or
# 384, K 896 to 4864, beside the kernels picked before). Split-K won by 10-55% wherever the tile rows in
# use (m up to 128) times K's slices of BOX_K reached MIN_WORK (Qwen2.5-0.5B's down_proj, K 4864, at 64 to
# 256 rows: 0.40x-0.76x cuBLAS before, 0.88x-0.91x split; K 2048 and 3072 from 256 rows), tied or lost
# below it (K 3072 at 64 rows: 2% faster; MiniLM's FFN down, K 1536: 10% slower at 256 rows, 6% faster
# at 1,024; K 896: slower), and at 16 and 32 rows matmul_tc was as fast or faster. Of the cluster sizes,
# the largest whose blocks fit the multiprocessors was the fastest at every point (more blocks than
# fit: up to 2x slower).
MIN_ROWS = 64
MIN_WORK = 4096  # min(m, 128) x ceil(K / BOX_K), at least


def tmak_name(dtype: str, splits: int) -> str:
    return f"matmul_tmak{splits}_128x128_{SHORT[dtype]}_{SHORT[dtype]}"


def splits_of(name: str) -> int:
    """The cluster size of a matmul_tmak kernel, from its name."""
    return int(name.removeprefix("matmul_tmak").split("_")[0])


def tma_splits(batch: int, m: int, n: int, k: int, dtype: str) -> int:
    """The splits of K for `batch` products (m, k) @ (n, k)^T of `dtype` operands on Hopper: 1 (no
    split-K: matmul_tma, matmul_wg or matmul_tc as before) below MIN_ROWS rows or MIN_WORK, else the most
    of SPLITS whose blocks (tiles x splits) fit in SMS (1 where none does: more tiles than SMS / 2, or
    where matmul_tma's 128 x 64 tiles serve: matmul_tma.narrow)."""
    ktiles = -(-k // BOX_K)
    if dtype not in SHORT or k % ALIGN or m < MIN_ROWS or min(m, TILES["128x128"].bm) * ktiles < MIN_WORK:
        return 1
    if narrow(batch, m, n, k):
        return 1
    tiles = tiles_of(TILES["128x128"], batch, m, n)
    return max((s for s in SPLITS if tiles * s <= SMS and ktiles >= s), default=1)


def tmak_grid(name: str, batch: int, m: int, n: int) -> tuple[int, int, int]:
    """A cluster of splits_of(name) blocks per tile, z the batch."""
    return (tiles_of(TMAK_TILES[name], 1, m, n) * splits_of(name), 1, batch)


def _spec(name: str, dtype: str) -> KernelSpec:
    """matmul_tma's interface and rule (naming this kernel), and a slice of K for every split."""
    unsplit = next(spec for spec in TMA_SPECS if spec.name == f"matmul_tma128x128_{SHORT[dtype]}_{SHORT[dtype]}")
    unsplit_check, splits = tma_rule(name, dtype), splits_of(name)

    def check(t: Sequence[TensorInfo], s: Sequence[int | float]) -> None:
        unsplit_check(t, s)
        k = int(s[3])
        need(
            k > (splits - 1) * BOX_K,
            f"{name} splits K in {splits}: K must hold {splits} slices of {BOX_K} (more than {(splits - 1) * BOX_K}), "
            f"not {k}",
        )

    return dataclasses.replace(unsplit, name=name, check=check)


BACKENDS = ("cuda",)  # the backends whose sources have these kernels
SPECS = [_spec(name, dtype) for name in TMAK_TILES for dtype in SHORT if name.endswith(f"_{SHORT[dtype]}")]

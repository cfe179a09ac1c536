"""Products of float32 x and float16 or bfloat16 w on the tensor cores, for up to 64 rows of x per
weight matrix (CUDA, compute capability 8.0 and later; family matvec_tc: gpud/ops/matvec_tc.cu).

`matvec_tc<R>[w<W>]_f32_<w>` for R in 8, 16, 32, 64 and w in f16, bf16: matmul's tensors, scalars and rule
(see gpud_protocol.ops.matmul) for x float32 and w as (N, K) only (wt = 1, a Linear's weight), at most R
rows of x per weight matrix; out float32. x enters as two tf32 parts (about 22 of its 24 bits in every
product), float32 accumulators. The block's warps (8, or W: 4 or 16) split K; a row's sum does not
depend on the rows beside it or on R, so every row gets the bits it gets alone. The warp count does
change the bits, so tf_kernel picks it by the weight alone (`tf_warps`: 16 where N is small, giving
few blocks more warps each, 4 where it is wide), the same for every row count. Grid: tf_grid, one block of 32 threads
per warp for each TF_COLUMNS columns of out, folded into y past 65,535; z the batch.

The op (gpud_client's matmul) picks them in graphs of rows (`gpu.graph(name, rows=True)`, merged
decode), for every instance from 1 row to 64: a merged launch must give each row the bits it gets in
the 1-row instance, and at 8 to 32 rows these are 1.4-4.1x faster than matvec's groups. Elsewhere a
single row stays on matvec, which these do not match at one row (H200, benchmarks/matvec_tc_harness.py:
o_proj 3.7 against 2.8 us, the down projection 13.9 against 7.1, the LM head 138 against 83; with them
picked for every product, one client's window decode fell from 905 tokens/s to 708:
benchmarks/results/h200/session10/).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from gpud_protocol.ops import KernelSpec, TensorInfo, need
from gpud_protocol.ops.matmul import SPECS as MATMUL_SPECS
from gpud_protocol.ops.matmul import fold

SHORT = {"float16": "f16", "bfloat16": "bf16"}  # w's dtype; x is float32
MIN_CAPABILITY = (8, 0)  # mma.sync's tf32 form
TF_ROWS = (8, 16, 32, 64)
TF_COLUMNS = 16  # columns of out per block
TF_WARPS = (4, 8, 16)
FEW_COLUMNS = 2048  # weights of at most these N take 16 warps, wider ones 4 (H200, harness of session 11:
# the down projection 10.3 us at one row with 16 against 13.7 with 8, 25.0 at 32 rows against 35.0; the
# gate/up projection 9.3 with 4 against 11.8, 21.9 at 32 rows against 27.3)


def tf_name(rows: int, warps: int, w_short: str) -> str:
    return f"matvec_tc{rows}{'' if warps == 8 else f'w{warps}'}_f32_{w_short}"


# name: (rows, warps)
TF_KERNELS = {tf_name(r, wp, t): (r, wp) for t in SHORT.values() for wp in TF_WARPS for r in TF_ROWS}
_TILED = {spec.name: spec for spec in MATMUL_SPECS}


def tf_warps(n: int) -> int:
    """The warps that split K for a weight of n columns of out: the same for every row count."""
    return 16 if n <= FEW_COLUMNS else 4


def tf_kernel(m: int, n: int, x_dtype: str, w_dtype: str, wt: bool, capability: str) -> str | None:
    """The matvec_tc kernel for m rows of float32 x per weight w (n, K) of float16 or bfloat16 on a
    device of `capability` ("9.0"), or None (other dtypes or layouts, more than 64 rows, older GPUs)."""
    if x_dtype != "float32" or w_dtype not in SHORT or not wt or m > TF_ROWS[-1]:
        return None
    try:
        major, minor = (int(part) for part in capability.split("."))
    except ValueError:
        return None
    if (major, minor) < MIN_CAPABILITY:
        return None
    rows = next(r for r in TF_ROWS if m <= r)
    return tf_name(rows, tf_warps(n), SHORT[w_dtype])


def tf_grid(name: str, batch: int, n: int) -> tuple[int, int, int]:
    """One block per TF_COLUMNS columns of out, folded into y past 65,535; z the batch."""
    return fold(-(-n // TF_COLUMNS), batch)


def _spec(name: str, rows: int, warps: int, w_dtype: str) -> KernelSpec:
    """matmul_f32_<w>'s interface and rule, for w as (N, K) and at most `rows` rows of x per weight matrix."""
    tiled = _TILED[f"matmul_f32_{SHORT[w_dtype]}"]

    def check(t: Sequence[TensorInfo], s: Sequence[int | float]) -> None:
        need(s[6] == 1, f"takes w as (N, K) only (wt 1), not wt {s[6]}")
        need(1 <= s[1] <= rows, f"takes 1 to {rows} rows of x per weight matrix, not {s[1]}")
        tiled.check(t, s)

    return dataclasses.replace(tiled, name=name, family="matvec_tc", check=check, block=32 * warps)


BACKENDS = ("cuda",)  # the backends whose sources have these kernels

SPECS = [
    _spec(name, rows, warps, dtype)
    for dtype, t in SHORT.items()
    for name, (rows, warps) in TF_KERNELS.items()
    if name.endswith("_" + t)
]

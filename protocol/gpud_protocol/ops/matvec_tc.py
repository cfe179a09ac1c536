"""Products of float32 x and float16 or bfloat16 w on the tensor cores, for up to 64 rows of x per
weight matrix (CUDA, compute capability 8.0 and later; family matvec_tc: gpud/ops/matvec_tc.cu).

`matvec_tc<R>_f32_<w>` for R in 8, 16, 32, 64 and w in f16, bf16: matmul's tensors, scalars and rule (see
gpud_protocol.ops.matmul) for x float32 and w as (N, K) only (wt = 1, a Linear's weight), at most R
rows of x per weight matrix; out float32. x enters as two tf32 parts (about 22 of its 24 bits in every
product), float32 accumulators; a row's sum does not depend on the rows beside it or on R, so every
row gets the bits it gets alone (merged replays equal solo ones). Grid: tf_grid, one block of 256
threads per TF_COLUMNS columns of out, folded into y past 65,535; z the batch. tf_kernel picks
the variant for a product, or None where the kernels do not apply.

The op (gpud_client's matmul) does not pick them yet. A merged decode step must give each row the bits
that row gets alone, so one kernel family has to serve every row count, and at one row these are
1.2-1.7x slower than matvec (H200, benchmarks/matvec_tc_harness.py: o_proj 3.7 against 2.8 us, the
down projection 13.9 against 7.1, the LM head 138 against 83), while at 8 to 32 rows they are 1.4-4.1x
faster than matvec's groups. With the op picking them for every row count, `gpud bench decode` on that
H200 gave merged steps 2,643 tokens/s at 8 clients and 4,565 at 32 (2,158 and 2,847 on matvec) but one
client's window steps 708 (905): benchmarks/results/h200/session10/.
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
TF_KERNELS = {f"matvec_tc{rows}_f32_{t}": rows for t in SHORT.values() for rows in TF_ROWS}  # name: rows
_TILED = {spec.name: spec for spec in MATMUL_SPECS}


def tf_kernel(m: int, x_dtype: str, w_dtype: str, wt: bool, capability: str) -> str | None:
    """The matvec_tc kernel for m rows of float32 x per weight w of float16 or bfloat16 as (N, K) on a
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
    return f"matvec_tc{rows}_f32_{SHORT[w_dtype]}"


def tf_grid(name: str, batch: int, n: int) -> tuple[int, int, int]:
    """One block per TF_COLUMNS columns of out, folded into y past 65,535; z the batch."""
    return fold(-(-n // TF_COLUMNS), batch)


def _spec(name: str, rows: int, w_dtype: str) -> KernelSpec:
    """matmul_f32_<w>'s interface and rule, for w as (N, K) and at most `rows` rows of x per weight matrix."""
    tiled = _TILED[f"matmul_f32_{SHORT[w_dtype]}"]

    def check(t: Sequence[TensorInfo], s: Sequence[int | float]) -> None:
        need(s[6] == 1, f"takes w as (N, K) only (wt 1), not wt {s[6]}")
        need(1 <= s[1] <= rows, f"takes 1 to {rows} rows of x per weight matrix, not {s[1]}")
        tiled.check(t, s)

    return dataclasses.replace(tiled, name=name, family="matvec_tc", check=check)


BACKENDS = ("cuda",)  # the backends whose sources have these kernels

SPECS = [
    _spec(name, rows, dtype)
    for dtype, t in SHORT.items()
    for name, rows in TF_KERNELS.items()
    if name.endswith("_" + t)
]

"""matvec with each element of x read once for several rows of w (CUDA only; in gpud/ops/matmul.cu).

`matvec_sx_f32_<w>` for w in f32, f16, bf16: matvec_f32_<w>'s tensors, scalars, rule and bits (a row's
products summed in the same order), for w as (N, K) only (wt = 1). A thread takes sx_rows(m) rows of w:
4 for up to 4 rows of x, 2 for up to 8, and multiplies each element of x it reads by all of them, where
matvec reads x through L1 once per row of w: that traffic bounds matvec with several rows of x by a
wide w (merged decode steps, an LM head). Grid: sx_grid, one block of 256 threads per
256 / threads_per_row(k) * sx_rows(m) rows of out, folded into y past 65,535; z the batch. sx_kernel
picks it where it applies and its grid keeps MIN_BLOCKS blocks (fewer: matvec's smaller blocks keep
more multiprocessors busy).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from gpud_protocol.ops import KernelSpec, TensorInfo, need
from gpud_protocol.ops.matmul import BLOCK, MATVEC_ROWS, SHORT, fold, threads_per_row
from gpud_protocol.ops.matmul import SPECS as MATMUL_SPECS

MIN_ROWS = 4  # fewer rows of x: x through L1 does not bound matvec
MIN_BLOCKS = 264  # two blocks per multiprocessor of an H100
_MATVEC = {spec.name: spec for spec in MATMUL_SPECS if spec.name.startswith("matvec_f32_")}


def sx_rows(m: int) -> int:
    """Rows of w per thread for m rows of x (the kernel's rule: registers hold 4 x 4 or 8 x 2 sums)."""
    return 4 if m <= 4 else 2


def sx_grid(batch: int, n: int, k: int, m: int) -> tuple[int, int, int]:
    return fold(-(-n // (BLOCK // threads_per_row(k) * sx_rows(m))), batch)


def sx_kernel(m: int, n: int, k: int, x_dtype: str, w_dtype: str, wt: bool) -> str | None:
    """matvec_sx for m (<= MATVEC_ROWS) rows of x per weight matrix, or None where matvec serves better."""
    if not wt or x_dtype != "float32" or not MIN_ROWS <= m <= MATVEC_ROWS:
        return None
    if sx_grid(1, n, k, m)[0] * sx_grid(1, n, k, m)[1] < MIN_BLOCKS:
        return None
    return f"matvec_sx_f32_{SHORT[w_dtype]}"


def _spec(w_dtype: str) -> KernelSpec:
    matvec = _MATVEC[f"matvec_f32_{SHORT[w_dtype]}"]

    def check(t: Sequence[TensorInfo], s: Sequence[int | float]) -> None:
        need(s[6] == 1, f"takes w as (N, K) only (wt 1), not wt {s[6]}")
        matvec.check(t, s)

    return dataclasses.replace(matvec, name=f"matvec_sx_f32_{SHORT[w_dtype]}", check=check)


BACKENDS = ("cuda",)  # the backends whose sources have these kernels

SPECS = [_spec(dtype) for dtype in ("float32", "float16", "bfloat16")]

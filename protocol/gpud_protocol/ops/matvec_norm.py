"""matvec of a row's RMS norm, in one launch (CUDA only; in gpud/ops/matmul.cu).

`matvec_norm_f32_<w>_<nw>(x, res, nw, w, bias, sum, out; m, n, k, eps, epilogue)`, for w and nw each
f32, f16 or bf16, but not one float16 and the other bfloat16 (as no product kernel mixes them):
sum = x + res and out = rmsnorm(sum, nw, eps) @ w.T (+ bias); x, res and sum float32 (m, k), nw (k,),
w (n, k) (a Linear's weight), out float32 (m, n), 1 <= m <= NORM_ROWS. Each block computes every
row's scale as add_rmsnorm does, in the same order, and each normalised element as it stores it, so
out has the bits of `add_rmsnorm` then matvec_f32_<w>. Grid and epilogue (the bias kind) as matvec's
with w as (N, K).
"""

from __future__ import annotations

from collections.abc import Sequence

from gpud_protocol.ops import KernelSpec, TensorInfo, need
from gpud_protocol.ops.matmul import BIAS_KINDS, LIMIT, SHORT, matvec_grid, mixes_halves

NORM_ROWS = 2  # rows of x: matvec's 80 registers (4 rows take 104, 8 spill)
DTYPES = ("float32", "float16", "bfloat16")
SCALARS = (("m", "u32"), ("n", "u32"), ("k", "u32"), ("eps", "f32"), ("epilogue", "u32"))


def norm_kernel(w_dtype: str, nw_dtype: str) -> str:
    return f"matvec_norm_f32_{SHORT[w_dtype]}_{SHORT[nw_dtype]}"


def norm_grid(n: int, k: int) -> tuple[int, int, int]:
    return matvec_grid(1, n, k, True)


def _spec(w_dtype: str, nw_dtype: str) -> KernelSpec:
    def check(t: Sequence[TensorInfo], s: Sequence[int | float]) -> None:
        x, res, nw, w, bias, total, out = t
        m, n, k, eps, epilogue = s
        need(x.dtype == "float32" and len(x.shape) == 2, f"x is {x.dtype} {list(x.shape)}, not float32 (M, K)")
        need((m, k) == x.shape, f"m and k passed ({m}, {k}) do not match x {list(x.shape)}")
        need(1 <= m <= NORM_ROWS, f"takes 1 to {NORM_ROWS} rows of x, not {m}")
        need(w.dtype == w_dtype and w.shape == (n, k), f"w is {w.dtype} {list(w.shape)}, not {w_dtype} [{n}, {k}]")
        need(nw.dtype == nw_dtype and nw.shape == (k,), f"the norm's weight is {nw.dtype} {list(nw.shape)}")
        need(out.dtype == "float32" and out.shape == (m, n), f"out is {out.dtype} {list(out.shape)}, not [{m}, {n}]")
        need(max(x.size, w.size, out.size) < LIMIT, f"more than {LIMIT - 1} elements in a tensor")
        need(isinstance(eps, float) and eps >= 0, f"eps is a float >= 0, not {eps}")
        need(res.dtype == "float32" and res.shape == x.shape, f"res is {res.dtype} {list(res.shape)}, not x's")
        need(total.dtype == "float32" and total.shape == x.shape, f"sum is {total.dtype} {list(total.shape)}")
        bias_kind = int(epilogue)
        need(bias_kind in (0, *BIAS_KINDS.values()), f"epilogue is a bias kind 0, 1, 2 or 3, not {epilogue}")
        if bias_kind:
            want = next(dtype for dtype, kind in BIAS_KINDS.items() if kind == bias_kind)
            need(
                bias.dtype == want and bias.shape == (n,), f"bias is {bias.dtype} {list(bias.shape)}, not {want} [{n}]"
            )

    tensors = ("x", "res", "nw", "w", "bias", "sum", "out")
    return KernelSpec(norm_kernel(w_dtype, nw_dtype), "matmul", "rmsnorm_matmul", tensors, (5, 6), SCALARS, check)


BACKENDS = ("cuda",)  # the backends whose sources have these kernels

SPECS = [_spec(w, nw) for w in DTYPES for nw in DTYPES if not mixes_halves(w, nw)]  # no float16 with bfloat16

"""Matrix products: matmul (x @ w, batched or not, w as (K, N) or PyTorch Linear's (N, K), an
optional bias), accumulated in float32; rows of x up to 8 per weight matrix (decode) go to a
matrix-vector kernel that reads each weight once; past that, float16 operands on CUDA go to the
tensor cores (a matmul_tc kernel with a tile sized to the product), anything else to matmul_<x>_<w>."""

from __future__ import annotations

from typing import Any

from gpud_client.errors import InvalidArgument
from gpud_client.ops.base import OpsBase, dtype_name
from gpud_protocol.ops import OpError
from gpud_protocol.ops.matmul import (
    BIAS_KINDS,
    DTYPES,
    MATVEC_ROWS,
    SHORT,
    matmul_grid,
    matvec_grid,
    out_dtype,
    plan,
    tc_grid,
    tc_kernel,
)


class MatmulOps(OpsBase):
    def matmul(
        self,
        x: Any,
        w: Any,
        *,
        transpose_w: bool = False,
        bias: Any = None,
        out: Any = None,
        graph: Any = None,
    ) -> Any:
        """x @ w (+ bias). x: (M, K) or (B, M, K); w: (K, N), or (N, K) with transpose_w (a Linear's
        weight), or batched (B, K, N) / (B, N, K); a 2-D w is shared by every batch. bias: (N,).
        float32 and float16 operands in any mix, accumulated in float32; out is float16 when x and w
        both are, else float32. Shape (M, N), or (B, M, N) when x or w is batched. On CUDA, float16
        x and w with more than 8 rows per weight matrix run on the tensor cores: the same exact float16
        products summed in float32, in another order."""
        xd, wd = dtype_name(x), dtype_name(w)
        if "bfloat16" in (xd, wd) or (bias is not None and dtype_name(bias) == "bfloat16"):
            raise InvalidArgument(
                "matmul: bfloat16 operands are not supported yet; cast to float16 (gpu.ops.cast(w, 'float16'))",
                op="matmul",
            )
        if xd not in DTYPES or wd not in DTYPES:
            raise InvalidArgument(f"matmul: float32 or float16 operands, not x {xd} and w {wd}")
        bias_kind = 0
        if bias is not None:
            bd = dtype_name(bias)
            if bd not in BIAS_KINDS:
                raise InvalidArgument(f"matmul: a float32 or float16 bias, not {bd}")
            bias_kind = BIAS_KINDS[bd]
        wt = bool(transpose_w)
        try:
            p = plan(tuple(x.shape), tuple(w.shape), wt)
            if p.m <= MATVEC_ROWS:
                name, grid = f"matvec_{SHORT[xd]}_{SHORT[wd]}", matvec_grid(p.batch, p.n, p.k, wt)
            elif xd == wd == "float16" and self._client.backend == "cuda":
                name = tc_kernel(p.m, p.n, p.k)
                grid = tc_grid(name, p.batch, p.m, p.n)
            else:
                name, grid = f"matmul_{SHORT[xd]}_{SHORT[wd]}", matmul_grid(p.batch, p.m, p.n)
        except OpError as exc:
            raise InvalidArgument(f"matmul: {exc}") from None
        result = self._out(out, p.out_shape, out_dtype(xd, wd), x, graph)
        tensors = [x, w, x if bias is None else bias, result]  # without a bias, x stands in (not read)
        self._run(name, grid, tensors, [*p.sizes, int(wt), bias_kind], graph)
        return result

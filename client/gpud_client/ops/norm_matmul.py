"""rmsnorm_matmul: a pre-norm decoder's residual add, RMS norm and the Linear after it (q/k/v, gate/up,
the LM head) in one call: on CUDA one launch where matmul would take the rows through matvec (1 or 2
float32 rows: decode; gpud_protocol.ops.matvec_norm), elsewhere add_rmsnorm (or rmsnorm) then matmul.
The bits are those of the two ops either way."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

from gpud_client.dtypes import dtype_name
from gpud_client.errors import InvalidArgument
from gpud_client.ops.base import Launch, OpsBase, info_of, of_rows, signed
from gpud_protocol.ops import TensorInfo
from gpud_protocol.ops.matmul import BIAS_KINDS, SHORT, mixes_halves
from gpud_protocol.ops.matvec_norm import DTYPES, NORM_ROWS, norm_grid, norm_kernel


class NormPlan(NamedTuple):
    """A fused call's launch and its output's shape; launch None: the two ops."""

    launch: Launch | None
    shape: tuple[int, ...]


class NormMatmulOps(OpsBase):
    # the ops it falls back on (gpu.ops has them all)
    add_rmsnorm: Callable[..., Any]
    rmsnorm: Callable[..., Any]
    matmul: Callable[..., Any]
    _matmul_plan: Callable[..., Any]

    def rmsnorm_matmul(
        self,
        x: Any,
        weight: Any,
        w: Any,
        eps: float = 1e-6,
        *,
        residual: Any = None,
        sum_out: Any = None,
        transpose_w: bool = False,
        bias: Any = None,
        out: Any = None,
        graph: Any = None,
    ) -> Any:
        """matmul(rmsnorm(x + residual, weight, eps), w, transpose_w=transpose_w, bias=bias): the Linear
        after a pre-norm decoder's residual add and norm. With `residual`, x + residual is stored into
        `sum_out` when given (the residual stream, as `add_rmsnorm` stores it). The bits of `add_rmsnorm`
        (`rmsnorm` without a residual) then `matmul`: on CUDA in one launch where matmul would run its
        matrix-vector kernel on float32 rows (1 or 2 rows by a Linear's (N, K) weight, transpose_w=True),
        every block computing the rows' scales as add_rmsnorm does; elsewhere in those two ops."""
        if residual is None:
            if sum_out is not None:
                raise InvalidArgument("sum_out receives x + residual: there is no residual", op="rmsnorm_matmul")
            normed = self.rmsnorm(x, weight, eps, graph=graph)
            return self._then_matmul(normed, w, transpose_w, bias, out, graph)
        key = (
            "rmsnorm_matmul",
            info_of(x),
            info_of(residual),
            info_of(weight),
            info_of(w),
            bool(transpose_w),
            None if bias is None else info_of(bias),
            None if sum_out is None else info_of(sum_out),
            None if out is None else info_of(out),
            signed(eps),
            of_rows(graph),
        )
        plan = self._plan(
            key, self._plan_norm_matmul, x, residual, weight, w, transpose_w, bias, sum_out, out, eps, graph
        )
        if plan.launch is None:
            total, normed = self.add_rmsnorm(x, residual, weight, eps, sum_out=sum_out, graph=graph)
            result = self._then_matmul(normed, w, transpose_w, bias, out, graph)
            if graph is None and sum_out is None:
                total.free()  # queued after the product that follows it
            return result
        total = self._out(sum_out, tuple(x.shape), "float32", x, graph)
        result = self._out(out, plan.shape, "float32", x, graph)
        self._launch(plan.launch, [x, residual, weight, w, x if bias is None else bias, total, result], graph, False)
        if graph is None and sum_out is None:
            total.free()
        return result

    def _then_matmul(self, normed: Any, w: Any, wt: bool, bias: Any, out: Any, graph: Any) -> Any:
        result = self.matmul(normed, w, transpose_w=wt, bias=bias, out=out, graph=graph)
        if graph is None:
            normed.free()  # queued after the product that reads it
        return result

    def _plan_norm_matmul(
        self,
        x: Any,
        residual: Any,
        weight: Any,
        w: Any,
        wt: bool,
        bias: Any,
        sum_out: Any,
        out: Any,
        eps: float,
        graph: Any,
    ) -> NormPlan:
        """The fused launch where it gives matvec's bits, else none (the two ops check their operands)."""
        xd, wd, nd = dtype_name(x), dtype_name(w), dtype_name(weight)
        if not (isinstance(eps, int | float) and math.isfinite(eps) and eps >= 0):
            raise InvalidArgument(f"eps must be finite and >= 0, not {eps!r}", op="rmsnorm_matmul")
        shapes = tuple(x.shape), tuple(residual.shape), tuple(w.shape)
        if not (
            self._client.backend == "cuda"
            and wt
            and xd == dtype_name(residual) == "float32"
            and wd in DTYPES
            and nd in DTYPES
            and not mixes_halves(wd, nd)
            and len(shapes[0]) == 2
            and shapes[0] == shapes[1]
            and 1 <= shapes[0][0] <= NORM_ROWS
            and len(shapes[2]) == 2
            and shapes[2][1] == shapes[0][1]
            and tuple(weight.shape) == (shapes[0][1],)
            and (sum_out is None or (dtype_name(sum_out) == "float32" and tuple(sum_out.shape) == shapes[0]))
            and all(info_of(t).strides is None for t in (x, residual, weight, w, sum_out, out) if t is not None)
        ):
            return NormPlan(None, ())
        product = self._matmul_plan(x, w, True, bias, out, None, of_rows(graph))  # the product of the norm
        if product.launch is None or product.launch.name != f"matvec_f32_{SHORT[wd]}":
            return NormPlan(None, ())  # another kernel's bits (a graph of rows: matvec_tc)
        (m, k), n = shapes[0], shapes[2][0]
        kind = 0 if bias is None else BIAS_KINDS[dtype_name(bias)]
        total = TensorInfo("float32", (m, k)) if sum_out is None else sum_out
        result = TensorInfo("float32", (m, n)) if out is None else out
        tensors = [x, residual, weight, w, x if bias is None else bias, total, result]
        launch = self._check(norm_kernel(wd, nd), norm_grid(n, k), tensors, [m, n, k, float(eps), kind])
        return NormPlan(launch, (m, n))

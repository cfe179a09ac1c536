"""Normalizations over the last axis: rmsnorm, layernorm (optionally of x + a residual: a post-LN
transformer's residual add and norm) and normalize (gpud_protocol.ops.reduce's kernels). Inputs are
float32, float16 or bfloat16, accumulated in float32. On a software WebGPU adapter (lavapipe) layernorm
over rows a multiple of 8 long runs a thread per row (gpud_protocol.ops.rows); on CUDA, over rows of at
most 1,024, a warp per row (gpud_protocol.ops.reduce_warp), with the residual added in the same launch."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

from gpud_client.dtypes import dtype_name
from gpud_client.errors import InvalidArgument
from gpud_client.ops.base import OpsBase, Planned, info_of, same_memory, signed
from gpud_client.ops.reduce import rows_of
from gpud_protocol.ops import TensorInfo, grid_1d, layout_problem
from gpud_protocol.ops.reduce import SHORT
from gpud_protocol.ops.reduce_warp import warp_applies, warp_grid
from gpud_protocol.ops.rows import rows_apply, rows_grid


class AddNorm(NamedTuple):
    """A layernorm of x + residual, checked: `fused`, its one launch (add_layernorm_warp), or None where
    `add` then layernorm run instead."""

    fused: Planned | None


class NormOps(OpsBase):
    add: Callable[..., Any]  # ElementwiseOps's (gpu.ops has both): the sum where no kernel fuses it

    def rmsnorm(self, x: Any, weight: Any, eps: float = 1e-6, *, out: Any = None, graph: Any = None) -> Any:
        """x / sqrt(mean(x^2 over the last axis) + eps) * weight; weight (L,) float32, float16 or bfloat16
        (of any dtype: x's need not be weight's)."""
        return self._norm("rmsnorm", x, (weight,), eps, out, graph)

    def layernorm(
        self,
        x: Any,
        weight: Any,
        bias: Any,
        eps: float = 1e-5,
        *,
        residual: Any = None,
        out: Any = None,
        graph: Any = None,
    ) -> Any:
        """(x - mean) / sqrt(var + eps) * weight + bias over the last axis (the biased variance, as
        torch's layer_norm); weight and bias (L,), both of one float dtype (x's or another).

        With `residual` (x's shape and dtype): the layernorm of x + residual, the sum rounded to x's
        dtype first, so the bits of `layernorm(add(x, residual))` (BERT's LayerNorm(x + sublayer(x))).
        One launch on CUDA where a row fits a warp (at most 1,024), else add then layernorm."""
        params = (weight, bias)
        if residual is None:
            return self._norm("layernorm", x, params, eps, out, graph)
        if out is not None and (same_memory(out, x) or same_memory(out, residual)):
            raise InvalidArgument("out is also an input; ops do not run in place", op="layernorm")
        plan = self._add_norm_plan(x, residual, params, eps, out).fused
        if plan is not None:
            return self._execute(plan, [x, residual, *params], out, x, graph)
        total = self.add(x, residual, graph=graph)
        try:
            return self._norm("layernorm", total, params, eps, out, graph)
        finally:
            if graph is None:
                total.free()  # queued after the layernorm that reads it (or refused)

    def normalize(self, x: Any, eps: float = 1e-12, *, out: Any = None, graph: Any = None) -> Any:
        """x / max(||x||, eps) with the L2 norm over the last axis (torch.nn.functional.normalize, p=2,
        dim=-1); same shape and dtype as x."""
        key = ("normalize", info_of(x), None if out is None else info_of(out), signed(eps))
        return self._execute(self._plan(key, self._plan_normalize, x, eps, out), [x], out, x, graph)

    def _plan_normalize(self, x: Any, eps: float, out: Any) -> Planned:
        dtype, rows, length = rows_of("normalize", x)
        _check_eps("normalize", eps)
        result = TensorInfo(dtype, tuple(x.shape)) if out is None else out
        launch = self._check(f"normalize_{SHORT[dtype]}", _grid(rows), [x, result], [rows, length, float(eps)])
        return Planned(tuple(x.shape), dtype, launch)

    def _norm(self, op: str, x: Any, params: tuple[Any, ...], eps: float, out: Any, graph: Any) -> Any:
        return self._execute(self._norm_plan(op, x, params, eps, out), [x, *params], out, x, graph)

    def _norm_plan(self, op: str, x: Any, params: tuple[Any, ...], eps: float, out: Any) -> Planned:
        """The plan of a norm for these operands (checked when made; `nn`'s norms keep their own)."""
        infos = [info_of(p) for p in params]
        key = (op, info_of(x), *infos, None if out is None else info_of(out), signed(eps))
        return self._plan(key, self._plan_norm, op, x, params, eps, out)

    def _add_norm_plan(self, x: Any, residual: Any, params: tuple[Any, ...], eps: float, out: Any) -> AddNorm:
        """The plan of a layernorm of x + residual (checked when made; `nn.LayerNorm` keeps its own)."""
        infos = [info_of(p) for p in params]
        key = ("+layernorm", info_of(x), info_of(residual), *infos, None if out is None else info_of(out), signed(eps))
        return self._plan(key, self._plan_add_norm, x, residual, params, eps, out)

    def _plan_add_norm(self, x: Any, residual: Any, params: tuple[Any, ...], eps: float, out: Any) -> AddNorm:
        dtype, _, length = rows_of("layernorm", x)
        if dtype_name(residual) != dtype:
            raise InvalidArgument(
                f"residual is {dtype_name(residual)}, x is {dtype}: x + residual is taken in x's dtype", op="layernorm"
            )
        if tuple(residual.shape) != tuple(x.shape):
            raise InvalidArgument(f"residual is {list(residual.shape)}, not x's shape {list(x.shape)}", op="layernorm")
        for name, tensor in (("x", x), ("residual", residual)):  # add's rule too: refused alike everywhere
            if problem := layout_problem(info_of(tensor), name):
                raise InvalidArgument(problem, op="layernorm")
        if self._client.backend == "cuda" and warp_applies(length):
            return AddNorm(self._plan_norm("layernorm", x, params, eps, out, residual))
        return AddNorm(None)

    def _plan_norm(
        self, op: str, x: Any, params: tuple[Any, ...], eps: float, out: Any, residual: Any = None
    ) -> Planned:
        """The norm's kernel for these operands; with `residual`, add_layernorm_warp (the caller's choice)."""
        dtype, rows, length = rows_of(op, x)
        wdtype = dtype_name(params[0])
        if wdtype not in SHORT:
            raise InvalidArgument(f"weight is {wdtype}, not one of {list(SHORT)}", op=op)
        _check_eps(op, eps)
        result = TensorInfo(dtype, tuple(x.shape)) if out is None else out
        name, grid = f"{op}_{SHORT[dtype]}_{SHORT[wdtype]}", _grid(rows)
        if op == "layernorm" and rows_apply(length) and self._software(x):  # lavapipe: a thread per row
            name, grid = f"layernorm_rows_{SHORT[dtype]}_{SHORT[wdtype]}", rows_grid(rows)
        elif op == "layernorm" and self._client.backend == "cuda" and warp_applies(length):  # a warp per row
            name, grid = f"layernorm_warp_{SHORT[dtype]}_{SHORT[wdtype]}", warp_grid(rows)
        inputs = [x, *params]
        if residual is not None:  # x + residual read by the warp kernel
            name, inputs = f"add_{name}", [x, residual, *params]
        return Planned(tuple(x.shape), dtype, self._check(name, grid, [*inputs, result], [rows, length, float(eps)]))


def _check_eps(op: str, eps: Any) -> None:
    if not (isinstance(eps, int | float) and math.isfinite(eps) and eps >= 0):
        raise InvalidArgument(f"eps must be finite and >= 0, not {eps!r}", op=op)


def _grid(rows: int) -> tuple[int, int, int]:
    """One workgroup per row, folded into y past 65,535."""
    return grid_1d(rows, 1)

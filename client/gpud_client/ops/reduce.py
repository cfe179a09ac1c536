"""Reductions over the last axis: sum, mean, max, argmax; softmax (with an optional additive mask),
rmsnorm and layernorm. Inputs are float32 or float16; everything accumulates in float32."""

from __future__ import annotations

import math
from typing import Any

from gpud_client.errors import InvalidArgument
from gpud_client.ops.base import OpsBase, dtype_name
from gpud_protocol.ops import OpError, grid_1d
from gpud_protocol.ops.reduce import REDUCE_OPS, SHORT, mask_rows, rows_and_length


class ReduceOps(OpsBase):
    def sum(self, x: Any, *, out: Any = None, graph: Any = None) -> Any:
        """The sum over the last axis: shape x.shape[:-1], float32."""
        return self._reduce("sum", x, out, graph)

    def mean(self, x: Any, *, out: Any = None, graph: Any = None) -> Any:
        """The mean over the last axis: shape x.shape[:-1], float32."""
        return self._reduce("mean", x, out, graph)

    def max(self, x: Any, *, out: Any = None, graph: Any = None) -> Any:
        """The maximum over the last axis: shape x.shape[:-1], float32."""
        return self._reduce("max", x, out, graph)

    def argmax(self, x: Any, *, out: Any = None, graph: Any = None) -> Any:
        """The first index of the maximum over the last axis: shape x.shape[:-1], int32 (rows
        without NaN)."""
        dtype, rows, length = self._rows("argmax", x)
        result = self._out(out, tuple(x.shape[:-1]), "int32", x, graph)
        self._run(f"argmax_{SHORT[dtype]}", _grid(rows), [x, result], [rows, length], graph)
        return result

    def softmax(self, x: Any, mask: Any = None, *, out: Any = None, graph: Any = None) -> Any:
        """Softmax over the last axis (max-subtracted), same shape and dtype as x. `mask`: an additive
        float32 mask whose shape ends x's (leading 1s allowed), broadcast over x's leading axes; -inf
        masks an element out, and a row whose every element is masked gives zeros."""
        dtype, rows, length = self._rows("softmax", x)
        result = self._out(out, tuple(x.shape), dtype, x, graph)
        if mask is None:
            self._run(f"softmax_{SHORT[dtype]}", _grid(rows), [x, result], [rows, length], graph)
            return result
        try:
            mrows = mask_rows(tuple(mask.shape), tuple(x.shape))
        except OpError as exc:
            raise InvalidArgument(f"softmax: {exc}") from None
        self._run(f"softmax_mask_{SHORT[dtype]}", _grid(rows), [x, mask, result], [rows, length, mrows], graph)
        return result

    def rmsnorm(self, x: Any, weight: Any, eps: float = 1e-6, *, out: Any = None, graph: Any = None) -> Any:
        """x / sqrt(mean(x^2 over the last axis) + eps) * weight; weight (L,) float32 or float16."""
        return self._norm("rmsnorm", x, (weight,), eps, out, graph)

    def layernorm(
        self, x: Any, weight: Any, bias: Any, eps: float = 1e-5, *, out: Any = None, graph: Any = None
    ) -> Any:
        """(x - mean) / sqrt(var + eps) * weight + bias over the last axis (the biased variance, as
        torch's layer_norm); weight and bias (L,), both float32 or both float16."""
        return self._norm("layernorm", x, (weight, bias), eps, out, graph)

    def _rows(self, op: str, x: Any) -> tuple[str, int, int]:
        dtype = dtype_name(x)
        if dtype not in SHORT:
            raise InvalidArgument(f"{op}: float32 or float16 tensors, not {dtype}")
        try:
            rows, length = rows_and_length(tuple(x.shape))
        except OpError as exc:
            raise InvalidArgument(f"{op}: {exc}") from None
        return dtype, rows, length

    def _reduce(self, op: str, x: Any, out: Any, graph: Any) -> Any:
        dtype, rows, length = self._rows(op, x)
        result = self._out(out, tuple(x.shape[:-1]), "float32", x, graph)
        self._run(f"reduce_{SHORT[dtype]}", _grid(rows), [x, result], [rows, length, REDUCE_OPS[op]], graph)
        return result

    def _norm(self, op: str, x: Any, params: tuple[Any, ...], eps: float, out: Any, graph: Any) -> Any:
        dtype, rows, length = self._rows(op, x)
        wdtype = dtype_name(params[0])
        if wdtype not in SHORT:
            raise InvalidArgument(f"{op}: weight is float32 or float16, not {wdtype}")
        if not (isinstance(eps, int | float) and math.isfinite(eps) and eps >= 0):
            raise InvalidArgument(f"{op}: eps must be finite and >= 0, not {eps!r}")
        result = self._out(out, tuple(x.shape), dtype, x, graph)
        name = f"{op}_{SHORT[dtype]}_{SHORT[wdtype]}"
        self._run(name, _grid(rows), [x, *params, result], [rows, length, float(eps)], graph)
        return result


def _grid(rows: int) -> tuple[int, int, int]:
    """One workgroup per row, folded into y past 65,535."""
    return grid_1d(rows, 1)

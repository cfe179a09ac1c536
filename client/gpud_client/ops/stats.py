"""Moments: `var` and `std` as numpy's, composed of the reductions and the elementwise ops (no kernel of
their own): the mean over the axes kept as 1, the deviations from it squared, and their mean (or their
sum over N - ddof); `std` is its square root. Two passes over x, as numpy's, in float32."""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Any

from gpud_client.dtypes import dtype_name
from gpud_client.errors import InvalidArgument
from gpud_client.operands import foreign, not_a_tensor
from gpud_client.ops.axes import result_shape
from gpud_client.ops.base import OpsBase
from gpud_protocol.ops.reduce import SHORT
from gpud_protocol.views import axis_index

Axes = int | tuple[int, ...] | None


class StatsOps(OpsBase):
    # the other families' (gpu.ops has every family)
    contiguous: Callable[..., Any]
    mean: Callable[..., Any]
    mul: Callable[..., Any]
    scale: Callable[..., Any]
    sqrt: Callable[..., Any]
    sub: Callable[..., Any]
    sum: Callable[..., Any]

    def var(
        self,
        x: Any,
        axis: Axes = -1,
        *,
        ddof: float = 0,
        keepdims: bool = False,
        out: Any = None,
        graph: Any = None,
    ) -> Any:
        """numpy.var: the mean of the squared deviations from the mean over `axis` (as `sum`: default
        the last, a tuple of axes, None for every element), or their sum over N - ddof (ddof=1: the
        unbiased estimate); float32. Where N - ddof <= 0 the result is inf (NaN where every deviation
        is 0), as numpy's (which warns). x of any view: a strided one is made dense first."""
        return self._moment("var", x, axis, ddof, keepdims, out, graph)

    def std(
        self,
        x: Any,
        axis: Axes = -1,
        *,
        ddof: float = 0,
        keepdims: bool = False,
        out: Any = None,
        graph: Any = None,
    ) -> Any:
        """numpy.std: the square root of `var` (the same arguments), float32."""
        return self._moment("std", x, axis, ddof, keepdims, out, graph)

    def _moment(self, op: str, x: Any, axis: Axes, ddof: float, keepdims: bool, out: Any, graph: Any) -> Any:
        shape, picked = _checked(op, x, axis, ddof, keepdims, out)  # before any op is queued
        count = math.prod(shape[a] for a in picked)
        over = None if axis is None else picked
        dense = self.contiguous(x, graph=graph)
        mean = self.mean(dense, over, keepdims=True, graph=graph)
        deviation = self.sub(dense, mean, graph=graph)
        squared = self.mul(deviation, deviation, graph=graph)
        temporaries = [mean, deviation, squared] + ([dense] if dense is not x else [])
        last = out if op == "var" else None
        if ddof == 0:
            var = self.mean(squared, over, keepdims=keepdims, out=last, graph=graph)
        else:
            total = self.sum(squared, over, keepdims=keepdims, graph=graph)
            temporaries.append(total)
            # numpy divides by max(N - ddof, 0): by zero, inf (NaN for a sum of 0)
            var = self.scale(total, 1 / (count - ddof) if count > ddof else math.inf, out=last, graph=graph)
        result = var
        if op == "std":
            result = self.sqrt(var, out=out, graph=graph)
            temporaries.append(var)
        if graph is None:  # each free is queued after the op that reads it
            for t in temporaries:
                t.free()
        return result


def _checked(
    op: str, x: Any, axis: Axes, ddof: float, keepdims: bool, out: Any
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(x's shape, the axes reduced, sorted), every argument checked."""
    if foreign(x):
        raise not_a_tensor(x)
    dtype, shape = dtype_name(x), tuple(x.shape)
    if dtype not in SHORT:
        raise InvalidArgument(f"x is {dtype}, not one of {list(SHORT)}", op=op)
    if axis is None:
        picked = list(range(len(shape)))
    else:
        axes = axis if isinstance(axis, tuple | list) else (axis,)
        try:
            picked = sorted(axis_index(operator.index(a), len(shape)) for a in axes)
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(f"axis {axis!r}: {exc}", op=op) from None
        if not picked or len(set(picked)) != len(picked):
            raise InvalidArgument(f"axis {axis} must name each axis of x {list(shape)} once, and at least one", op=op)
    if isinstance(ddof, bool) or not isinstance(ddof, int | float) or not math.isfinite(ddof):
        raise InvalidArgument(f"ddof must be a finite number, not {ddof!r}", op=op)
    if math.prod(shape[a] for a in picked) == 0:
        raise InvalidArgument(f"x {list(shape)} is empty along axis {axis}: there is nothing to reduce", op=op)
    if out is not None:
        result = result_shape(op, shape, picked, keepdims, None)
        if tuple(out.shape) != result or dtype_name(out) != "float32":
            raise InvalidArgument(
                f"out is {dtype_name(out)} {list(out.shape)}, the result float32 {list(result)}", op=op
            )
    return shape, tuple(picked)

"""Reductions: sum, mean, max, argmax and softmax over any axis (`axes` picks the kernel), and softmax with
an additive mask over the last axis. Inputs are float32, float16 or bfloat16; everything accumulates in
float32. The norms over the last axis, whose kernels are this family's too: gpud_client.ops.norms."""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Any

from gpud_client.dtypes import dtype_name
from gpud_client.errors import InvalidArgument
from gpud_client.ops.axes import Plan, plan, result_shape
from gpud_client.ops.base import OpsBase, Planned, info_of
from gpud_protocol.ops import OpError, TensorInfo, grid_1d
from gpud_protocol.ops.reduce import REDUCE_OPS, SHORT, mask_rows, rows_and_length
from gpud_protocol.ops.reduce_axis import grid as axis_grid
from gpud_protocol.views import axis_index

Axes = int | tuple[int, ...] | None


class ReduceOps(OpsBase):
    scale: Callable[..., Any]  # ElementwiseOps's (gpu.ops has both): min and argmin negate with it

    def sum(self, x: Any, axis: Axes = -1, *, keepdims: bool = False, out: Any = None, graph: Any = None) -> Any:
        """The sum over `axis` (default the last; negative counts from the end; a tuple: those axes;
        None: every element): x's shape without them, or with them as 1 with `keepdims` (numpy's),
        float32."""
        return self._over("sum", x, axis, keepdims, out, graph)

    def mean(self, x: Any, axis: Axes = -1, *, keepdims: bool = False, out: Any = None, graph: Any = None) -> Any:
        """The mean over `axis` (as `sum`), float32."""
        return self._over("mean", x, axis, keepdims, out, graph)

    def max(self, x: Any, axis: Axes = -1, *, keepdims: bool = False, out: Any = None, graph: Any = None) -> Any:
        """The maximum over `axis` (as `sum`; NaN where the axes hold one, as numpy's), float32."""
        return self._over("max", x, axis, keepdims, out, graph)

    def min(self, x: Any, axis: Axes = -1, *, keepdims: bool = False, out: Any = None, graph: Any = None) -> Any:
        """The minimum over `axis` (as `max`), float32: -max(-x), exact (negation is)."""
        negated = self.scale(x, -1.0, graph=graph)
        top = self.max(negated, axis, keepdims=keepdims, graph=graph)
        result = self.scale(top, -1.0, out=out, graph=graph)
        if graph is None:
            negated.free()
            top.free()
        return result

    def argmin(
        self, x: Any, axis: int | None = -1, *, keepdims: bool = False, out: Any = None, graph: Any = None
    ) -> Any:
        """The first index of the minimum over `axis` (as `argmax`; the first NaN's where the axis holds
        one, as numpy's), int32: argmax(-x)."""
        negated = self.scale(x, -1.0, graph=graph)
        result = self.argmax(negated, axis, keepdims=keepdims, out=out, graph=graph)
        if graph is None:
            negated.free()
        return result

    def argmax(
        self, x: Any, axis: int | None = -1, *, keepdims: bool = False, out: Any = None, graph: Any = None
    ) -> Any:
        """The first index of the maximum over `axis` (as `sum`; None: the index into x flattened, as
        numpy's; the first NaN's where the axis holds one), int32."""
        if keepdims:
            return self._kept("argmax", x, axis, out, graph)
        return self._reduce("argmax", x, axis, out, graph)

    def softmax(self, x: Any, mask: Any = None, *, axis: int | None = -1, out: Any = None, graph: Any = None) -> Any:
        """Softmax over `axis` (default the last; None: over every element), max-subtracted, same shape
        and dtype as x. `mask` (the last axis only): an additive float32 mask whose shape ends x's
        (leading 1s allowed), broadcast over x's leading axes; -inf masks an element out, and a row
        whose every element is masked gives zeros."""
        if mask is not None:
            return self._softmax_masked(x, mask, axis, out, graph)
        p = plan("softmax", x, axis)
        result = self._out(out, tuple(x.shape), p.dtype, x, graph)
        if math.prod(x.shape) == 0:
            return result
        flat = result if axis is not None else result.reshape(-1)
        if p.rows is not None:
            self._run(f"softmax_{SHORT[p.dtype]}", _grid(p.rows[0]), [p.x, flat], list(p.rows), graph)
        else:
            self._axis_run(f"softmax_axis_{SHORT[p.dtype]}", p.x, flat, p.view, [], graph)
        return result

    def _softmax_masked(self, x: Any, mask: Any, axis: int | None, out: Any, graph: Any) -> Any:
        if axis is None or axis not in (-1, len(x.shape) - 1):
            raise InvalidArgument("a mask is taken over the last axis only (axis=-1)", op="softmax")
        dtype, rows, length = rows_of("softmax", x)
        result = self._out(out, tuple(x.shape), dtype, x, graph)
        try:
            mrows = mask_rows(tuple(mask.shape), tuple(x.shape))
        except OpError as exc:
            raise InvalidArgument(f"softmax: {exc}") from None
        self._run(f"softmax_mask_{SHORT[dtype]}", _grid(rows), [x, mask, result], [rows, length, mrows], graph)
        return result

    def _over(self, op: str, x: Any, axis: Axes, keepdims: bool, out: Any, graph: Any) -> Any:
        if type(axis) is int:  # the common case first: one axis (`_kept` of one axis is `_reduce`'s keepdims)
            return self._reduce(op, x, axis, out, graph, keepdims=bool(keepdims))
        if isinstance(axis, tuple | list):
            return self._over_axes(op, x, tuple(axis), keepdims, out, graph)
        return self._kept(op, x, axis, out, graph) if keepdims else self._reduce(op, x, axis, out, graph)

    def _over_axes(self, op: str, x: Any, axes: tuple[Any, ...], keepdims: bool, out: Any, graph: Any) -> Any:
        """numpy's tuple of axes: one axis after another, the highest first (a mean of means is the
        mean: each has as many elements), into numpy's shape; the partial results freed as they go."""
        ndim = len(x.shape)
        try:
            picked = sorted({axis_index(operator.index(a), ndim) for a in axes})
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(f"axis {axes}: {exc}", op=op) from None
        if len(picked) != len(axes) or not picked:
            raise InvalidArgument(f"axis {axes} must name each axis of x {list(x.shape)} once, and at least one", op=op)
        if len(picked) == 1:
            return self._over(op, x, picked[0], keepdims, out, graph)
        if len(picked) == ndim:
            return self._over(op, x, None, keepdims, out, graph)
        reduced = result_shape(op, x.shape, picked, False, None)
        shape = result_shape(op, x.shape, picked, keepdims, out)
        part = x
        for a in reversed(picked[1:]):
            made = self._reduce(op, part, a, None, graph)
            if part is not x and graph is None:
                part.free()  # queued after the reduction that reads it
            part = made
        result = self._out(out, shape, "float32", x, graph)
        self._reduce(op, part, picked[0], result.reshape(reduced) if keepdims else result, graph)
        if graph is None:
            part.free()
        return result

    def _kept(self, op: str, x: Any, axis: int | None, out: Any, graph: Any) -> Any:
        """numpy's keepdims=True: the result in x's shape with the reduced axis (every axis, for None) as
        1, which the kernels write as they write the reduced shape (the same dense elements)."""
        if axis is not None:
            return self._reduce(op, x, axis, out, graph, keepdims=True)
        p = plan(op, x, axis)
        shape = result_shape(op, x.shape, range(len(x.shape)), True, out)
        result = self._out(out, shape, "int32" if op == "argmax" else "float32", x, graph)
        self._reduce(op, x, axis, result.reshape(p.reduced), graph)
        return result

    def _reduce(self, op: str, x: Any, axis: int | None, out: Any, graph: Any, keepdims: bool = False) -> Any:
        """Reduce (or argmax) one axis of x, or every element for None, into `out` or a new result."""
        if axis is None:  # over a flat view of x, made here (recorded, in a graph): not kept
            p = plan(op, x, axis)
            result = self._out(out, p.reduced, "int32" if op == "argmax" else "float32", x, graph)
            if p.empty:
                return result
            name, grid, scalars = _reduction(op, p)
            self._run(name, grid, [p.x, result], scalars, graph)
            return result
        key = ("_reduce", op, info_of(x), axis, keepdims, None if out is None else info_of(out))
        try:  # `_plan`'s lookup, inlined
            planned = self._plans.get(key)
        except TypeError:
            planned = None
        if planned is None:
            planned = self._plan(key, self._plan_reduce, op, x, axis, out, keepdims)
        return self._execute(planned, [x], out, x, graph)

    def _plan_reduce(self, op: str, x: Any, axis: int, out: Any, keepdims: bool) -> Planned:
        p = plan(op, x, axis)  # checks the axis
        dtype = "int32" if op == "argmax" else "float32"
        picked = (axis_index(operator.index(axis), len(x.shape)),)
        shape = result_shape(op, x.shape, picked, True, out) if keepdims else p.reduced
        if p.empty:
            return Planned(shape, dtype, None)
        name, grid, scalars = _reduction(op, p)
        return Planned(
            shape, dtype, self._check(name, grid, [x, TensorInfo(dtype, shape) if out is None else out], scalars)
        )

    def _axis_run(self, name: str, x: Any, out: Any, view: list[int] | None, extra: list[int], graph: Any) -> None:
        """A kernel of `reduce_axis`: its scalars are (n, length, inner), `extra`, then the view."""
        assert view is not None
        self._run(name, axis_grid(view[0]), [x, out], [*view[:3], *extra, *view[3:]], graph)


def _reduction(op: str, p: Plan) -> tuple[str, tuple[int, int, int], list[int]]:
    """The kernel, grid and scalars that reduce (or argmax) as `p` plans: a row kernel over the last
    axis of a dense x, else an axis kernel."""
    kind, codes = ("argmax", []) if op == "argmax" else ("reduce", [REDUCE_OPS[op]])
    if p.rows is not None:
        return f"{kind}_{SHORT[p.dtype]}", _grid(p.rows[0]), [*p.rows, *codes]
    assert p.view is not None
    return f"{kind}_axis_{SHORT[p.dtype]}", axis_grid(p.view[0]), [*p.view[:3], *codes, *p.view[3:]]


def rows_of(op: str, x: Any) -> tuple[str, int, int]:
    """(dtype, rows, length) of an x reduced over its last axis by a row kernel, checked."""
    dtype = dtype_name(x)
    if dtype not in SHORT:
        raise InvalidArgument(f"x is {dtype}, not one of {list(SHORT)}", op=op)
    try:
        rows, length = rows_and_length(tuple(x.shape))
    except OpError as exc:
        raise InvalidArgument(str(exc), op=op) from None
    return dtype, rows, length


def _grid(rows: int) -> tuple[int, int, int]:
    """One workgroup per row, folded into y past 65,535."""
    return grid_1d(rows, 1)

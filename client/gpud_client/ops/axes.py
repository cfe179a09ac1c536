"""Which kernel reduces an axis of x: the row kernels (`reduce`: a workgroup per row) for the last axis
of a dense x, else the axis kernels (`reduce_axis`: x read through its offset and strides, one thread
per output), which take any axis of any view without a copy."""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import Any, NamedTuple

from gpud_client.dtypes import dtype_name
from gpud_client.errors import InvalidArgument
from gpud_client.ops.base import _info
from gpud_protocol.ops import OpError, layout_problem
from gpud_protocol.ops.reduce import MAX_LENGTH, SHORT
from gpud_protocol.ops.reduce_axis import MAX_AXIS_LENGTH, geometry
from gpud_protocol.views import axis_index


class Plan(NamedTuple):
    x: Any  # what the kernel reads: x, or a flat view of it (axis=None)
    dtype: str
    reduced: tuple[int, ...]  # x's shape without the axis (numpy's keepdims=False); () for axis=None
    rows: tuple[int, int] | None  # (rows, length) for the row kernels
    view: list[int] | None  # else the axis kernels' scalars (n, length, inner, offset, strides...)

    @property
    def empty(self) -> bool:
        """Nothing to compute: x has no rows (a result of zero elements)."""
        return math.prod(self.reduced) == 0


def plan(op: str, x: Any, axis: int | None) -> Plan:
    dtype = dtype_name(x)
    if dtype not in SHORT:
        raise InvalidArgument(f"x is {dtype}, not one of {list(SHORT)}", op=op)
    if axis is None:
        if math.prod(x.shape) == 0:
            raise InvalidArgument(f"x {list(x.shape)} is empty: there is nothing to reduce", op=op)
        try:
            x = x.reshape(-1)
        except InvalidArgument:
            raise InvalidArgument(
                "axis=None: x is a non-contiguous view that does not flatten; call gpu.ops.contiguous(x) first", op=op
            ) from None
        reduced: tuple[int, ...] = ()
        axis = 0
    else:
        if len(x.shape) == 0:
            raise InvalidArgument("x must have at least one axis (the one reduced), or pass axis=None", op=op)
        try:
            axis = axis_index(operator.index(axis), len(x.shape))
        except TypeError:
            why = f"axis is {axis!r}: an int or None (sum, mean, max and min take a tuple too)"
            raise InvalidArgument(why, op=op) from None
        except ValueError as exc:
            raise InvalidArgument(f"{exc} of x {list(x.shape)}", op=op) from None
        reduced = tuple(x.shape[:axis]) + tuple(x.shape[axis + 1 :])
    length = int(x.shape[axis])
    if length == 0:
        raise InvalidArgument(f"axis {axis} of x {list(x.shape)} is empty: there is nothing to reduce", op=op)
    info = _info(x)
    if axis == len(x.shape) - 1 and layout_problem(info, "x") is None:
        if length > MAX_LENGTH:
            raise InvalidArgument(f"the last axis of x is {length} long; at most {MAX_LENGTH} is supported", op=op)
        return Plan(x, dtype, reduced, (math.prod(x.shape[:-1]), length), None)
    try:
        view = geometry(info, axis)
    except OpError as exc:
        raise InvalidArgument(f"{exc}: call gpu.ops.contiguous(x) first", op=op) from None
    if length > MAX_AXIS_LENGTH:
        raise InvalidArgument(
            f"axis {axis} of x is {length} long: over an axis other than the last of a dense tensor, at most "
            f"{MAX_AXIS_LENGTH} (one thread walks it)",
            op=op,
        )
    return Plan(x, dtype, reduced, None, view)


def result_shape(op: str, shape: tuple[int, ...], picked: Sequence[int], keepdims: bool, out: Any) -> tuple[int, ...]:
    """numpy's shape of reducing `shape` over the `picked` axes (kept as 1 with `keepdims`); `out=`
    must have it."""
    result = tuple(1 if i in picked else d for i, d in enumerate(shape) if keepdims or i not in picked)
    if out is not None and tuple(out.shape) != result:
        raise InvalidArgument(f"out is {list(out.shape)}, the result is {list(result)}", op=op)
    return result


__all__ = ["Plan", "plan", "result_shape"]

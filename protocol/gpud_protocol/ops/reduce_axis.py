"""Reductions over any axis of x, and of strided views: x (float32 or float16) seen as (outer, length,
inner), the axis reduced in the middle. The last axis of a dense x goes to the row kernels of
`reduce` (a workgroup per row); this family takes the rest without a copy or a transpose.

The view is passed as scalars: its element offset into x's tensor (bound whole) and one stride per
part, so x may be any view whose axes before the reduced one merge into one stride, and whose axes
after it do too (a transposed or narrowed matrix, a permuted view whose order keeps those runs).

reduce_axis_<x>(x, out; outer, length, inner, op, offset, s_outer, s_length, s_inner):
    out[o, i] (float32, dense) = sum (op 0), mean (1), max (2) over r of x[o, r, i].
argmax_axis_<x>(x, out; outer, length, inner, offset, s_outer, s_length, s_inner):
    out[o, i] (int32) = the first r where x[o, r, i] is largest (NaN-free).
softmax_axis_<x>(x, out; outer, length, inner, offset, s_outer, s_length, s_inner):
    out[o, r, i] (dense, x's shape and dtype) = the max-subtracted softmax over r.

One thread per (o, i), walking r: coalesced across i. `length` is at most MAX_AXIS_LENGTH (65,535:
the most iterations lavapipe runs of one loop). Everything accumulates in float32.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpud_protocol.ops import KernelSpec, OpError, TensorInfo, grid_1d, need
from gpud_protocol.ops.reduce import DTYPES, REDUCE_OPS, SHORT
from gpud_protocol.views import axis_index

FAMILY = "reduce_axis"
MAX_AXIS_LENGTH = 65_535
GEOMETRY = ("outer", "length", "inner")
STRIDES = ("offset", "s_outer", "s_length", "s_inner")


def merged(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, int] | None:
    """(elements, stride) of axes that walk as one (size-1 axes skipped), or None where they do not."""
    size, step = 1, 0
    for dim, stride in reversed(list(zip(shape, strides, strict=True))):
        if dim == 1:
            continue
        if size > 1 and stride != step * size:
            return None
        if size == 1:
            step = stride
        size *= dim
    return size, step


def geometry(x: TensorInfo, axis: int) -> list[int] | None:
    """The scalars (outer, length, inner, offset, s_outer, s_length, s_inner) that describe reducing
    `axis` of x, or None where x's axes before or after it do not merge."""
    axis = axis_index(axis, len(x.shape))
    steps = x.steps
    before = merged(x.shape[:axis], steps[:axis])
    after = merged(x.shape[axis + 1 :], steps[axis + 1 :])
    if before is None or after is None:
        return None
    return [before[0], x.shape[axis], after[0], x.offset, before[1], steps[axis], after[1]]


def grid(outer: int, inner: int) -> tuple[int, int, int]:
    return grid_1d(outer * inner)


def _check_x(x: TensorInfo, dtype: str, passed: Sequence[int | float]) -> int:
    """x against the geometry passed; returns the axis it reduces (the first that matches)."""
    need(x.dtype == dtype, f"x is {x.dtype}, this kernel takes {dtype}")
    need(len(x.shape) >= 1, "x must have at least one axis (the one reduced)")
    outer, length, inner = passed[:3]
    need(
        isinstance(length, int) and 1 <= length <= MAX_AXIS_LENGTH,
        f"the axis reduced is {length} long; 1 to {MAX_AXIS_LENGTH} are supported",
    )
    need(outer * inner >= 1, f"x {list(x.shape)} has nothing to reduce into")
    for axis in range(len(x.shape)):
        if geometry(x, axis) == list(passed):
            return axis
    raise OpError(
        f"the view passed {list(passed)} ({', '.join(GEOMETRY + STRIDES)}) describes no axis of x {list(x.shape)}"
    )


def _reduced(x: TensorInfo, axis: int) -> tuple[int, ...]:
    return x.shape[:axis] + x.shape[axis + 1 :]


def _reduce(dtype: str) -> KernelSpec:
    def check(t: Sequence[TensorInfo], s: Sequence[int | float]) -> None:
        x, out = t
        *head, op = s[:4]
        axis = _check_x(x, dtype, [*head, *s[4:]])
        need(out.dtype == "float32", f"out is {out.dtype}, the reduction is float32")
        need(
            out.shape == _reduced(x, axis),
            f"out is {list(out.shape)}, x without axis {axis} is {list(_reduced(x, axis))}",
        )
        need(op in REDUCE_OPS.values(), f"unknown reduction {op}")

    scalars = tuple((n, "u32") for n in (*GEOMETRY, "op", *STRIDES))
    codes = tuple(sorted(REDUCE_OPS, key=REDUCE_OPS.__getitem__))
    name = f"reduce_axis_{SHORT[dtype]}"
    return KernelSpec(name, FAMILY, "reduce", ("x", "out"), (1,), scalars, check, op_codes=codes, strided=(0,))


def _argmax(dtype: str) -> KernelSpec:
    def check(t: Sequence[TensorInfo], s: Sequence[int | float]) -> None:
        x, out = t
        axis = _check_x(x, dtype, s)
        need(out.dtype == "int32", f"out is {out.dtype}, argmax is int32")
        need(
            out.shape == _reduced(x, axis),
            f"out is {list(out.shape)}, x without axis {axis} is {list(_reduced(x, axis))}",
        )

    scalars = tuple((n, "u32") for n in (*GEOMETRY, *STRIDES))
    return KernelSpec(f"argmax_axis_{SHORT[dtype]}", FAMILY, "argmax", ("x", "out"), (1,), scalars, check, strided=(0,))


def _softmax(dtype: str) -> KernelSpec:
    def check(t: Sequence[TensorInfo], s: Sequence[int | float]) -> None:
        x, out = t
        _check_x(x, dtype, s)
        need(out.dtype == x.dtype, f"out is {out.dtype}, x is {x.dtype}")
        need(out.shape == x.shape, f"out is {list(out.shape)}, x is {list(x.shape)}")

    scalars = tuple((n, "u32") for n in (*GEOMETRY, *STRIDES))
    return KernelSpec(
        f"softmax_axis_{SHORT[dtype]}", FAMILY, "softmax", ("x", "out"), (1,), scalars, check, strided=(0,)
    )


SPECS = [
    *(_reduce(d) for d in DTYPES),
    *(_argmax(d) for d in DTYPES),
    *(_softmax(d) for d in DTYPES),
]

"""Reductions over any axis of x, and of any view: x (float32, float16 or bfloat16) read through an
element offset and strides, the axis reduced walked by one thread per output. The last axis of a dense
x goes to the row kernels of `reduce` (a workgroup per row); this family takes the rest without a copy
or a transpose.

The view is passed as scalars: its element offset into x's tensor (bound whole), the reduced axis's
length and stride, and x's other axes (in order) merged by `views.coalesce` into at most MAX_RANK,
padded in front with size 1, stride 0. Output k (row-major over x's other axes) reads x from
offset + sum(index_d * stride_d) (k unravelled over those sizes) + r * s_length.

reduce_axis_<x>(x, out; n, length, inner, op, offset, s_length, size0..5, stride0..5):
    out[k] (float32, dense) = sum (op 0), mean (1), max (2) over r of x's elements of output k.
argmax_axis_<x>(x, out; n, length, inner, offset, s_length, size0..5, stride0..5):
    out[k] (int32) = the first r where output k's element r is largest (NaN-free).
softmax_axis_<x>(x, out; n, length, inner, offset, s_length, size0..5, stride0..5):
    out (dense, x's shape and dtype) = the max-subtracted softmax over the axis; output k's element r
    is at (k / inner) * length * inner + r * inner + k % inner.
n: the outputs (x's size without the axis); inner: the size of x's axes after it. The out of
reduce_axis and argmax_axis is x's shape without the axis, or with it as 1 (numpy's keepdims).

One thread per output, walking r: neighbouring threads read neighbouring elements where x's last
axis is not the one reduced. `length` is at most MAX_AXIS_LENGTH (65,535: the most iterations
lavapipe runs of one loop). Everything accumulates in float32.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from gpud_protocol.ops import KernelSpec, OpError, TensorInfo, grid_1d, need
from gpud_protocol.ops.reduce import DTYPES, REDUCE_OPS, SHORT
from gpud_protocol.views import MAX_RANK, axis_index, coalesce

FAMILY = "reduce_axis"
MAX_AXIS_LENGTH = 65_535
HEAD = ("n", "length", "inner")
VIEW = ("offset", "s_length", *(f"size{i}" for i in range(MAX_RANK)), *(f"stride{i}" for i in range(MAX_RANK)))


def geometry(x: TensorInfo, axis: int) -> list[int]:
    """The scalars (n, length, inner, offset, s_length, sizes..., strides...) that describe reducing
    `axis` of x. Raises OpError where x's other axes do not merge into MAX_RANK."""
    axis = axis_index(axis, len(x.shape))
    steps = x.steps
    others = [i for i in range(len(x.shape)) if i != axis]
    sizes, strides = coalesce(tuple(x.shape[i] for i in others), tuple(steps[i] for i in others))
    need(
        len(sizes) <= MAX_RANK,
        f"x is a view whose axes other than {axis} take {len(sizes)} strides; at most {MAX_RANK}",
    )
    pad = MAX_RANK - len(sizes)
    n, inner = math.prod(x.shape[i] for i in others), math.prod(x.shape[axis + 1 :])
    head = [n, x.shape[axis], inner, x.offset, steps[axis]]
    return [*head, *([1] * pad), *sizes, *([0] * pad), *strides]


def grid(n: int) -> tuple[int, int, int]:
    """One thread per output."""
    return grid_1d(n)


def _check_x(x: TensorInfo, dtype: str, passed: Sequence[int | float]) -> int:
    """x against the view passed; returns the axis it reduces (the first that matches)."""
    need(x.dtype == dtype, f"x is {x.dtype}, this kernel takes {dtype}")
    need(len(x.shape) >= 1, "x must have at least one axis (the one reduced)")
    n, length = passed[:2]
    need(
        isinstance(length, int) and 1 <= length <= MAX_AXIS_LENGTH,
        f"the axis reduced is {length} long; 1 to {MAX_AXIS_LENGTH} are supported",
    )
    need(n >= 1, f"x {list(x.shape)} has nothing to reduce into")
    for axis in range(len(x.shape)):
        try:
            if geometry(x, axis) == list(passed):
                return axis
        except OpError:
            continue
    names = ", ".join((*HEAD, *VIEW))
    raise OpError(f"the view passed {list(passed)} ({names}) describes no axis of x {list(x.shape)}")


def _reduced(x: TensorInfo, axis: int) -> tuple[int, ...]:
    return x.shape[:axis] + x.shape[axis + 1 :]


def _check_reduced(x: TensorInfo, axis: int, out: TensorInfo) -> None:
    """out is x without the axis, or x with the axis 1 (numpy's keepdims: the same elements)."""
    kept = (*x.shape[:axis], 1, *x.shape[axis + 1 :])
    need(
        out.shape in (_reduced(x, axis), kept),
        f"out is {list(out.shape)}, x without axis {axis} is {list(_reduced(x, axis))}",
    )


def _reduce(dtype: str) -> KernelSpec:
    def check(t: Sequence[TensorInfo], s: Sequence[int | float]) -> None:
        x, out = t
        op = s[3]
        axis = _check_x(x, dtype, [*s[:3], *s[4:]])
        need(out.dtype == "float32", f"out is {out.dtype}, the reduction is float32")
        _check_reduced(x, axis, out)
        need(op in REDUCE_OPS.values(), f"unknown reduction {op}")

    scalars = tuple((n, "u32") for n in (*HEAD, "op", *VIEW))
    codes = tuple(sorted(REDUCE_OPS, key=REDUCE_OPS.__getitem__))
    name = f"reduce_axis_{SHORT[dtype]}"
    return KernelSpec(name, FAMILY, "reduce", ("x", "out"), (1,), scalars, check, op_codes=codes, strided=(0,))


def _argmax(dtype: str) -> KernelSpec:
    def check(t: Sequence[TensorInfo], s: Sequence[int | float]) -> None:
        x, out = t
        axis = _check_x(x, dtype, s)
        need(out.dtype == "int32", f"out is {out.dtype}, argmax is int32")
        _check_reduced(x, axis, out)

    scalars = tuple((n, "u32") for n in (*HEAD, *VIEW))
    return KernelSpec(f"argmax_axis_{SHORT[dtype]}", FAMILY, "argmax", ("x", "out"), (1,), scalars, check, strided=(0,))


def _softmax(dtype: str) -> KernelSpec:
    def check(t: Sequence[TensorInfo], s: Sequence[int | float]) -> None:
        x, out = t
        _check_x(x, dtype, s)
        need(out.dtype == x.dtype, f"out is {out.dtype}, x is {x.dtype}")
        need(out.shape == x.shape, f"out is {list(out.shape)}, x is {list(x.shape)}")

    scalars = tuple((n, "u32") for n in (*HEAD, *VIEW))
    return KernelSpec(
        f"softmax_axis_{SHORT[dtype]}", FAMILY, "softmax", ("x", "out"), (1,), scalars, check, strided=(0,)
    )


SPECS = [
    *(_reduce(d) for d in DTYPES),
    *(_argmax(d) for d in DTYPES),
    *(_softmax(d) for d in DTYPES),
]

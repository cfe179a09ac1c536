"""numpy's basic indexing of a tensor: `t[0]`, `t[-1]`, `t[:, 1:3]`, `t[::2]`, `t[..., None]`, a view
made in the client as `narrow` makes one (gpud_client.views): no copy, no message.

Integers (numpy's too; negative counts from the end) pick one element of an axis and drop it, slices
keep a range of it (a step above 1 is a stride), `None` adds an axis of size 1, `...` stands for every
axis not named, and axes past the last index are kept whole. What numpy does with a copy is refused
with what to use instead: fancy indexing (lists, arrays, ranges or tensors of indices, boolean masks)
and slices of a step below 1 (views have no negative strides).
"""

from __future__ import annotations

import math
import operator
from typing import Any

import numpy as np

from gpud_client.errors import InvalidArgument
from gpud_protocol import views as geometry

Geometry = tuple[tuple[int, ...], tuple[int, ...], int]  # shape, strides (in elements), offset (in elements)

_VALID = (
    "only integers, slices (`:`), ellipsis (`...`), numpy.newaxis (`None`) are valid indices of a tensor "
    "(integer or boolean arrays are numpy's fancy indexing, which copies)"
)


def indexed(shape: tuple[int, ...], strides: tuple[int, ...], offset: int, key: Any) -> tuple[Geometry, bool]:
    """The geometry of `key` applied to a view of this geometry, and whether `reshape` alone could make
    it (nothing but `None`, `...`, whole slices and integers on axes of size 1). IndexError where numpy
    raises one (an integer out of range, too many indices); InvalidArgument for what makes no view."""
    items = key if isinstance(key, tuple) else (key,)
    kinds = [_kind(item) for item in items]
    named = sum(k in ("int", "slice") for k in kinds)
    ellipses = kinds.count("...")
    if ellipses > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    ndim = len(shape)
    if named > ndim:
        raise IndexError(f"too many indices for tensor: tensor is {ndim}-dimensional, but {named} were indexed")
    start = offset
    kept: list[tuple[int, int]] = []  # the result's axes, outermost first: (size, stride)
    reshape = True
    d = 0  # the next axis of the tensor
    for item, kind in zip(items, kinds, strict=True):
        if kind == "None":  # torch's unsqueeze: the stride that the axis after it spans
            kept.append((1, shape[d] * strides[d] if d < ndim else 1))
        elif kind == "...":
            kept += [(shape[a], strides[a]) for a in range(d, d + ndim - named)]
            d += ndim - named
        elif kind == "int":
            i = operator.index(item)
            if not -shape[d] <= i < shape[d]:
                raise IndexError(f"index {i} is out of bounds for axis {d} with size {shape[d]}")
            start = geometry.narrowed(shape, strides, start, d, i, 1)[2]
            reshape = reshape and shape[d] == 1
            d += 1
        else:
            size, stride, start = _sliced(shape, strides, start, d, item)
            kept.append((size, stride))
            reshape = reshape and size == shape[d]
            d += 1
    kept += [(shape[a], strides[a]) for a in range(d, ndim)]
    result = tuple(size for size, _ in kept)
    if math.prod(result) == 0:  # an empty view reaches no element: left where it was, inside its tensor
        start = offset
    return (result, tuple(stride for _, stride in kept), start), reshape


def _kind(item: Any) -> str:
    """What `item` indexes by ("int", "slice", "None" or "..."); else the error numpy would raise, or
    for what numpy copies, the refusal saying what to use instead."""
    if item is None:
        return "None"
    if item is Ellipsis:
        return "..."
    if isinstance(item, slice):
        return "slice"
    if isinstance(item, bool | np.bool_):
        raise _fancy("a boolean (numpy reads it as a 0-d boolean mask)")
    if isinstance(item, np.ndarray):
        if item.ndim == 0 and item.dtype.kind in "iu":
            return "int"
        raise _fancy("a boolean mask" if item.dtype == np.bool_ else "a numpy array of indices")
    if isinstance(item, list | tuple | range):
        raise _fancy(f"a {type(item).__name__} of indices")
    if hasattr(item, "shape") and not isinstance(item, np.generic):  # a tensor (of a session or a recording)
        if str(getattr(item, "dtype", "")) == "bool":
            raise _fancy("a boolean mask tensor")
        raise _fancy("a tensor of indices")
    try:
        operator.index(item)
    except TypeError:
        raise IndexError(f"{_VALID}, not {type(item).__name__} {item!r}") from None
    return "int"


def _fancy(what: str) -> InvalidArgument:
    return InvalidArgument(
        f"indexing by {what} is numpy's fancy indexing, which copies; a tensor's indexing makes views "
        "(integers, slices, None, ...): gather rows by an int tensor of ids with gpu.ops.embedding(ids, "
        "table), select by a mask with gpu.ops.where(mask, x, y), or index the host copy ((await t.numpy())[...])",
        op="indexing",
    )


def _sliced(shape: tuple[int, ...], strides: tuple[int, ...], offset: int, d: int, item: slice) -> tuple[int, int, int]:
    """(size, stride, the new offset) of axis `d` sliced by `item` (numpy's clipping of start and stop)."""
    step = 1 if item.step is None else operator.index(item.step)
    if step == 0:
        raise InvalidArgument("a slice of step 0: a slice's step cannot be zero", op="indexing")
    if step < 0:
        raise InvalidArgument(
            f"a slice of step {step}: views have no negative strides; take a positive step, or slice "
            f"the host copy ((await t.numpy())[::{step}])",
            op="indexing",
        )
    first, stop, _ = item.indices(shape[d])
    size = len(range(first, stop, step))
    offset = geometry.narrowed(shape, strides, offset, d, first, (size - 1) * step + 1 if size else 0)[2]
    return size, strides[d] * step if size > 1 else strides[d], offset


__all__ = ["indexed"]

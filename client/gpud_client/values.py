"""Leaf values of the client API: kernel scalars, kernel handles, and the shape helpers that the
client, its views, the op library and graphs share (so none of them imports another for these)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

from gpud_client.errors import InvalidArgument
from gpud_protocol import ArgKind


class Scalar(NamedTuple):
    kind: int  # an ArgKind
    value: int | float


TENSOR, F32, I32, U32 = (int(k) for k in (ArgKind.TENSOR, ArgKind.F32, ArgKind.I32, ArgKind.U32))


def f32(value: float) -> Scalar:
    return Scalar(F32, float(value))


def i32(value: int) -> Scalar:
    return Scalar(I32, int(value))


def u32(value: int) -> Scalar:
    return Scalar(U32, int(value))


class Kernel(NamedTuple):
    handle: int
    entry: str
    writes: tuple[int, ...] | None  # tensor-argument positions the kernel writes, as the daemon sees it
    unchecked: tuple[str, ...] = ()  # what the daemon could not check about this kernel


def reshaped(old: tuple[int, ...], new: int | Sequence[Any]) -> tuple[int, ...]:
    """`new` (a shape, or a shape's dimensions as a sequence of one shape) with a -1 resolved, checked
    to hold as many elements as `old`."""
    if not isinstance(new, int) and len(new) == 1 and not isinstance(new[0], int):
        new = new[0]
    dims = [int(new)] if isinstance(new, int) else [int(d) for d in new]
    total = math.prod(old)
    if dims.count(-1) > 1 or any(d < -1 for d in dims):
        raise InvalidArgument(f"reshape to {dims}: dimensions are >= 0, with at most one -1")
    if -1 in dims:
        known = math.prod(d for d in dims if d != -1)
        if known == 0 or total % known:
            raise InvalidArgument(f"cannot reshape {list(old)} to {dims}")
        dims[dims.index(-1)] = total // known
    if math.prod(dims) != total:
        raise InvalidArgument(f"cannot reshape {list(old)} to {dims}: {total} elements, not {math.prod(dims)}")
    return tuple(dims)


def dim3(value: int | Sequence[int]) -> tuple[int, int, int]:
    dims = (value,) if isinstance(value, int) else tuple(int(v) for v in value)
    if not 1 <= len(dims) <= 3:
        raise InvalidArgument(f"grid/block needs 1 to 3 dimensions, got {value!r}")
    padded = dims + (1,) * (3 - len(dims))
    return (padded[0], padded[1], padded[2])

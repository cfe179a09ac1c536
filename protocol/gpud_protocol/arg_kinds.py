"""What an argument is: a `(kind, value)` pair of a dispatch or of a graph's step, and the scalar kinds,
defined once (their names as kernels declare them, their packing and their ranges)."""

from __future__ import annotations

import enum

from gpud_protocol.views import TensorView


class ArgKind(enum.IntEnum):
    TENSOR = 0  # a session tensor: the value is its handle (in a dispatch, a handle or a `TensorView`)
    F32 = 1
    I32 = 2
    U32 = 3
    INPUT = 4  # in a graph recording: the value indexes the graph's inputs
    BIND = 5  # ... its bound tensors
    TEMP = 6  # ... its intermediates
    SCALAR = 7  # ... its scalars
    VIEW = 8  # ... its views (a tensor of the graph with another shape)


GRAPH_TENSOR_KINDS = frozenset({ArgKind.TENSOR, ArgKind.INPUT, ArgKind.BIND, ArgKind.TEMP, ArgKind.VIEW})

# Each scalar kind: its name (as a kernel declares it), the `struct` format of its 4 bytes, and the
# range of an integer kind (inclusive; None: a float). The tables below are views of this one.
_SCALARS: tuple[tuple[ArgKind, str, str, tuple[int, int] | None], ...] = (
    (ArgKind.F32, "f32", "f", None),
    (ArgKind.I32, "i32", "i", (-(1 << 31), (1 << 31) - 1)),
    (ArgKind.U32, "u32", "I", (0, (1 << 32) - 1)),
)
SCALAR_NAMES = {kind: name for kind, name, _, _ in _SCALARS}
SCALAR_KINDS = {name: kind for kind, name, _, _ in _SCALARS}
SCALAR_FORMATS = {kind: fmt for kind, _, fmt, _ in _SCALARS}
SCALAR_RANGES = {kind: bounds for kind, _, _, bounds in _SCALARS if bounds is not None}

Arg = tuple[int, int | float]  # (ArgKind, value); a TENSOR's value is its handle
DispatchArg = tuple[int, int | float | TensorView]  # (ArgKind, value); a TENSOR's value a handle or a view

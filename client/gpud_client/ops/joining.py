"""Joining tensors: `concatenate`, `stack`, `hstack` and `vstack` (numpy's names; torch's cat and
stack), and `split`, their inverse, whose parts are views (no copy). Each joined piece is made dense
with the joined axis first (`contiguous` of a permuted view, a kernel only where the piece is not
already so) and copied into its range of the result, then the whole is permuted back; no new kernel.
Copies move 4-byte words, so pieces of 1- or 2-byte elements whose ranges do not fall on word
boundaries are joined through a wider dtype (float32, or int32 for integers) and cast back: exact.
Not recorded into graphs: a recording's tensors take no narrowed views."""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from gpud_client.dtypes import dtype_name
from gpud_client.errors import InvalidArgument
from gpud_client.operands import foreign, not_a_tensor
from gpud_client.ops.base import OpsBase
from gpud_protocol.limits import DTYPE_SIZES
from gpud_protocol.ops.dtypes import FLOATS
from gpud_protocol.views import axis_index

WORD = 4


class JoinOps(OpsBase):
    cast: Callable[..., Any]  # ElementwiseOps's (gpu.ops has every family)
    contiguous: Callable[..., Any]  # LayoutOps's
    not_equal: Callable[..., Any]  # ElementwiseOps's

    def concatenate(self, tensors: Sequence[Any], axis: int = 0, *, out: Any = None, graph: Any = None) -> Any:
        """numpy.concatenate: tensors of one dtype and device whose shapes agree but along `axis`."""
        pieces = list(tensors)
        shape, dtype, ax = _joined("concatenate", pieces, axis)
        if graph is not None:
            raise InvalidArgument(
                "not recorded into graphs (a recording's tensors take no narrowed views)", op="concatenate"
            )
        if out is not None and (tuple(out.shape) != shape or dtype_name(out) != dtype):
            raise InvalidArgument(
                f"out is {dtype_name(out)} {list(out.shape)}, the result {dtype} {list(shape)}", op="concatenate"
            )
        rest = math.prod(shape) // shape[ax] if shape[ax] else 0
        size = DTYPE_SIZES[dtype]
        if any(p.shape[ax] * rest * size % WORD for p in pieces):  # a range inside a word: join wider
            return self._join_wider(pieces, ax, dtype, out)
        result = self._out(out, shape, dtype, pieces[0], None)
        order = [ax, *(i for i in range(len(shape)) if i != ax)]
        front = result if ax == 0 else self._out(None, tuple(shape[i] for i in order), dtype, pieces[0], None)
        start = 0
        for piece in pieces:
            length = piece.shape[ax]
            if length:
                dense = self.contiguous(piece.permute(order) if ax else piece)
                self._client.copy(dense, front.narrow(0, start, length))  # type: ignore[attr-defined]
                if dense is not piece:
                    dense.free()
            start += length
        if front is not result:
            self.contiguous(front.permute(sorted(range(len(order)), key=order.__getitem__)), out=result)
            front.free()
        return result

    def stack(self, tensors: Sequence[Any], axis: int = 0, *, out: Any = None, graph: Any = None) -> Any:
        """numpy.stack: tensors of one shape, dtype and device joined along a new axis `axis`."""
        pieces = list(tensors)
        if not pieces or any(foreign(p) for p in pieces):
            raise _not_tensors("stack", pieces)
        first = tuple(pieces[0].shape)
        if any(tuple(p.shape) != first for p in pieces):
            shapes = ", ".join(str(list(p.shape)) for p in pieces)
            raise InvalidArgument(f"the tensors' shapes differ: {shapes}", op="stack")
        try:
            ax = axis_index(int(axis), len(first) + 1)
        except ValueError as exc:
            raise InvalidArgument(str(exc), op="stack") from None
        expanded = [p.reshape(*first[:ax], 1, *first[ax:]) for p in pieces]
        return self.concatenate(expanded, ax, out=out, graph=graph)

    def hstack(self, tensors: Sequence[Any], *, out: Any = None, graph: Any = None) -> Any:
        """numpy.hstack: joined along axis 1, or along axis 0 where they are 1-D (0-d ones as (1,))."""
        pieces = [_at_least(1, p) for p in tensors]
        axis = 0 if pieces and len(getattr(pieces[0], "shape", ())) == 1 else 1
        return self._join_as("hstack", pieces, axis, out, graph)

    def vstack(self, tensors: Sequence[Any], *, out: Any = None, graph: Any = None) -> Any:
        """numpy.vstack: joined along axis 0, 1-D tensors (N,) as rows (1, N) (0-d ones as (1, 1))."""
        return self._join_as("vstack", [_at_least(2, p) for p in tensors], 0, out, graph)

    def split(
        self, x: Any, indices_or_sections: int | Sequence[int] | np.ndarray[Any, Any], axis: int = 0
    ) -> list[Any]:
        """numpy.split: x's parts along `axis`, as views (`narrow`: no copy, no message). An int N: N
        equal parts (the axis must divide evenly); a list of indices: the parts between them (as
        slices: negative counts from the end, past the end is empty). Not in recordings."""
        if foreign(x):
            raise not_a_tensor(x)
        if getattr(x, "graph", None) is not None:
            raise x._no_strides("split")
        shape = tuple(x.shape)
        try:
            ax = axis_index(operator.index(axis), len(shape))
            if isinstance(indices_or_sections, Sequence | np.ndarray):
                cuts = [operator.index(i) for i in indices_or_sections]
            else:
                cuts = _equal_cuts(shape[ax], operator.index(indices_or_sections))
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(str(exc), op="split") from None
        parts = []
        for start, end in zip([0, *cuts], [*cuts, shape[ax]], strict=True):
            first, stop, _ = slice(start, end).indices(shape[ax])
            parts.append(x.narrow(ax, first, max(stop - first, 0)))
        return parts

    def _join_as(self, op: str, pieces: list[Any], axis: int, out: Any, graph: Any) -> Any:
        """concatenate, its refusals naming `op`."""
        try:
            return self.concatenate(pieces, axis, out=out, graph=graph)
        except InvalidArgument as exc:
            if exc.op != "concatenate" or exc.seq is not None:
                raise
            raise InvalidArgument(exc.message, op=op) from None

    def _join_wider(self, pieces: list[Any], ax: int, dtype: str, out: Any) -> Any:
        wide = "float32" if dtype in FLOATS or dtype == "bool" else "int32"
        widened = [self.cast(p, wide) for p in pieces]
        joined = self.concatenate(widened, ax)
        for w in widened:
            w.free()
        result = self.not_equal(joined, 0.0, out=out) if dtype == "bool" else self.cast(joined, dtype, out=out)
        joined.free()
        return result


def _joined(op: str, pieces: list[Any], axis: int) -> tuple[tuple[int, ...], str, int]:
    """(the joined shape, the dtype, the axis) of `pieces`, checked."""
    if not pieces or any(foreign(p) for p in pieces):
        raise _not_tensors(op, pieces)
    dtype, first = dtype_name(pieces[0]), tuple(pieces[0].shape)
    if not first:
        raise InvalidArgument("0-d tensors have no axis to join along (stack them)", op=op)
    try:
        ax = axis_index(int(axis), len(first))
    except ValueError as exc:
        raise InvalidArgument(str(exc), op=op) from None
    for p in pieces:
        shape = tuple(p.shape)
        if dtype_name(p) != dtype:
            raise InvalidArgument(f"the tensors are {dtype} and {dtype_name(p)}: cast them to one dtype", op=op)
        if len(shape) != len(first) or shape[:ax] + shape[ax + 1 :] != first[:ax] + first[ax + 1 :]:
            raise InvalidArgument(f"shapes {list(first)} and {list(shape)} differ outside axis {ax}", op=op)
        if getattr(p, "device", None) != getattr(pieces[0], "device", None):
            raise InvalidArgument("the tensors live on different devices: copy them to one first", op=op)
    return (*first[:ax], sum(p.shape[ax] for p in pieces), *first[ax + 1 :]), dtype, ax


def _not_tensors(op: str, pieces: list[Any]) -> InvalidArgument:
    if not pieces:
        return InvalidArgument("needs at least one tensor", op=op)
    return not_a_tensor(next(p for p in pieces if foreign(p)))


def _at_least(ndim: int, tensor: Any) -> Any:
    """numpy's atleast_1d and atleast_2d: a view with leading axes of size 1 (anything else as it is)."""
    if foreign(tensor) or len(tensor.shape) >= ndim:
        return tensor
    return tensor.reshape((1,) * (ndim - len(tensor.shape)) + tuple(tensor.shape))


def _equal_cuts(size: int, sections: int) -> list[int]:
    """Where `sections` equal parts of an axis of `size` start (after the first)."""
    if sections < 1:
        raise ValueError(f"{sections} sections: the number of sections must be at least 1")
    if size % sections:
        raise ValueError(f"an axis of {size} does not split into {sections} equal parts (numpy's equal division)")
    return [size // sections * i for i in range(1, sections)]

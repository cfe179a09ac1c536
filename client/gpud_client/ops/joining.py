"""Joining tensors: `concatenate` and `stack` (numpy's names; torch's cat and stack). Each piece is
made dense with the joined axis first (`contiguous` of a permuted view, a kernel only where the piece
is not already so) and copied into its range of the result, then the whole is permuted back; no new
kernel. Copies move 4-byte words, so pieces of 1- or 2-byte elements whose ranges do not fall on
word boundaries are joined through a wider dtype (float32, or int32 for integers) and cast back:
exact. Not recorded into graphs: a recording's tensors take no narrowed views."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

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

"""Views of a tensor made in the client: `reshape`, `transpose`, `permute`, `narrow` (torch's semantics),
`.T` and numpy's basic indexing, `t[0, 1:3, ..., None]` (gpud_client.indexing).

A view is a `Tensor` whose `base` is the tensor whose memory it is, with its own shape, strides and
element offset into that memory (`gpud_protocol.views`). Making one sends nothing and copies nothing:
it travels with each op as its base's handle and its geometry, and costs the daemon no handle.

What takes which view: the op library's kernels that read through strides (`gpu.ops.contiguous`, the
reductions over an axis) take any view; every other kernel takes contiguous views (a narrow along the
first axis is one), bound at their offset where it is a multiple of 256 bytes; otherwise the op says
to call `gpu.ops.contiguous(t)` first. Readbacks take any view; uploads and copies take contiguous ones.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol, Self

import numpy as np
from numpy.lib.stride_tricks import as_strided

from gpud_client.dtypes import from_storage, storage_dtype, values_dtype
from gpud_client.errors import InvalidArgument
from gpud_client.indexing import indexed
from gpud_client.memo import Memo
from gpud_client.values import reshaped
from gpud_protocol import views as geometry

if TYPE_CHECKING:
    from gpud_client.dtypes import HostDType
    from gpud_protocol.ops import TensorInfo


# (shape, strides, the dimensions asked for) -> (shape, strides) of the view: reshapes repeat every step
_reshapes: Memo[tuple[Any, ...], tuple[tuple[int, ...], tuple[int, ...]]] = Memo(4096)
# (the op, shape, strides, its dimensions) -> (shape, strides) of a transpose or permute
_moved: Memo[tuple[Any, ...], tuple[tuple[int, ...], tuple[int, ...]]] = Memo(4096)


class Strided(Protocol):
    """What a view's geometry is read from (gpud_client.tensor.Tensor)."""

    dtype: HostDType
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # in elements
    offset: int  # in elements, into the base's memory

    @property
    def base(self) -> Strided: ...


class TensorViews:
    """The view methods of `Tensor` (mixed in: `Tensor` sets these attributes and `_view`)."""

    __slots__ = ()

    shape: tuple[int, ...]
    strides: tuple[int, ...]  # in elements
    offset: int  # in elements, into the base's memory
    info: TensorInfo  # what the op library's rules see: strides None where they are row-major

    def _view(self, shape: tuple[int, ...], strides: tuple[int, ...], offset: int) -> Self:
        raise NotImplementedError

    @property
    def T(self) -> Self:
        """Every axis reversed (numpy's `.T`; torch's for a 2-D tensor): a view."""
        shape, strides = reversed_axes(self.shape, self.strides)
        return self._view(shape, strides, self.offset)

    def __getitem__(self, key: Any) -> Self:
        """numpy's basic indexing (integers, slices of a positive step, None, ...): a view, no copy, no
        message (gpud_client.indexing). Fancy indexing is refused with what to use instead."""
        (shape, strides, offset), _reshape = indexed(self.shape, self.strides, self.offset, key)
        return self._view(shape, strides, offset)

    def __iter__(self) -> Iterator[Self]:
        """A view of each element of the first axis, as numpy iterates an array."""
        if not self.shape:
            raise TypeError("iteration over a 0-d tensor")
        return (self[i] for i in range(self.shape[0]))

    @property
    def is_contiguous(self) -> bool:
        """Row-major without gaps (it may still start at an offset of its base: a narrow of the first axis)."""
        return self.info.strides is None  # the info's strides are None exactly where they are row-major

    def reshape(self, *shape: int | Sequence[int]) -> Self:
        """This memory with another shape (one dimension may be -1): a view, no copy, no message.

        A non-contiguous view reshapes only where its strides allow it without a copy (torch's rule
        for `view`); otherwise call `gpu.ops.contiguous(t)` first. A view lives as long as its base:
        freeing the base ends its views; freeing a view ends only that view."""
        key = (self.shape, self.strides, shape)
        try:
            known = _reshapes.get(key)
        except TypeError:  # unhashable dimensions (a list): worked out, not kept
            return self._view(*self._reshaped(shape), self.offset)
        if known is None:
            known = _reshapes.keep(key, self._reshaped(shape))
        return self._view(known[0], known[1], self.offset)

    def _reshaped(self, shape: tuple[int | Sequence[int], ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The shape and strides of `reshape(*shape)`, checked."""
        dims = reshaped(self.shape, shape)
        strides = geometry.view_strides(self.shape, self.strides, dims)
        if strides is None:
            raise InvalidArgument(
                f"{self!r} (strides {list(self.strides)}) cannot be seen as {list(dims)} without a copy: "
                "call gpu.ops.contiguous(t) first",
                op="reshape",
            )
        return dims, strides

    def transpose(self, dim0: int, dim1: int) -> Self:
        """Dimensions `dim0` and `dim1` swapped (negative: from the end): a view, as torch.transpose."""
        shape, strides = _geometry("transpose", geometry.transposed, self.shape, self.strides, dim0, dim1)
        return self._view(shape, strides, self.offset)

    def permute(self, *dims: int | Sequence[int]) -> Self:
        """The dimensions in the order `dims` (a permutation): a view, as torch.permute."""
        order: list[int] = []
        for d in dims:  # permute(1, 0) or permute((1, 0))
            order += [int(d)] if isinstance(d, int) else [int(e) for e in d]
        shape, strides = _geometry("permute", geometry.permuted, self.shape, self.strides, tuple(order))
        return self._view(shape, strides, self.offset)

    def narrow(self, dim: int, start: int, length: int) -> Self:
        """Elements [start, start + length) of dimension `dim`: a view, as torch.narrow. Along the first
        axis of a contiguous tensor it stays contiguous (only its offset moves)."""
        try:
            shape, strides, offset = geometry.narrowed(
                self.shape, self.strides, self.offset, int(dim), int(start), int(length)
            )
        except ValueError as exc:
            raise InvalidArgument(str(exc), op="narrow") from None
        return self._view(shape, strides, offset)


def reversed_axes(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The shape and strides of `.T` (every axis reversed), kept (`q @ k.T` every step: no permutation to build)."""
    known = _moved.get(("T", shape, strides))
    if known is None:
        order = tuple(reversed(range(len(shape))))
        known = _moved.keep(("T", shape, strides), _geometry("permute", geometry.permuted, shape, strides, order))
    return known


def _geometry(op: str, fn: Any, *args: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """fn's (shape, strides) of the view, kept by its arguments (transposes repeat every step)."""
    key: tuple[Any, ...] | None = (op, *args)
    for a in args:
        if type(a) is not int and type(a) is not tuple:  # fn refuses it: not kept
            key = None
            break
    known = None if key is None else _moved.get(key)
    if known is not None:
        return known
    try:
        result: tuple[tuple[int, ...], tuple[int, ...]] = fn(*args)
    except ValueError as exc:
        raise InvalidArgument(str(exc), op=op) from None
    return result if key is None else _moved.keep(key, result)


def picked(data: bytes | memoryview | np.ndarray[Any, Any], tensor: Strided) -> np.ndarray[Any, Any]:
    """A view's elements, out of the bytes its readback sent (`gpud_protocol.views.span`), as a new array."""
    itemsize = tensor.dtype.itemsize
    first, _nbytes = geometry.span(tensor.offset, tensor.shape, tensor.strides, itemsize)
    raw = np.frombuffer(data, np.uint8) if not isinstance(data, np.ndarray) else data.view(np.uint8).reshape(-1)
    skip = tensor.offset * itemsize - first
    if math.prod(tensor.shape) == 0:
        return np.zeros(tensor.shape, values_dtype(tensor.dtype))
    count = (raw.nbytes - skip) // itemsize
    elements = raw[skip : skip + count * itemsize].view(storage_dtype(tensor.dtype))
    byte_strides = tuple(s * itemsize for s in tensor.strides)
    return from_storage(np.array(as_strided(elements, tensor.shape, byte_strides, writeable=False)), tensor.dtype)


def dense_range(tensor: Strided, op: str) -> None:
    """Refuse (here, as the daemon would) a view that a copy or an upload cannot move exactly."""
    base = tensor.base
    if base is tensor:
        return
    try:
        geometry.dense_range(tensor.offset, tensor.shape, tensor.strides, tensor.dtype.itemsize, math.prod(base.shape))
    except ValueError as exc:
        raise InvalidArgument(f"{tensor!r}: {exc}", op=op) from None


__all__ = ["TensorViews", "dense_range", "picked"]

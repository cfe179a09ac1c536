"""Views: a tensor seen with another shape, without a handle of its own.

On the wire a tensor operand is either a handle (an int) or a view of one, the msgpack array
``[handle, offset, [shape...], [strides...]]``: the base tensor's handle, an element offset into it,
the view's shape and its element strides. A view costs the daemon nothing to hold (no handle, no
quota, nothing to free), and the same view sent again is the same key to every cache.

The codec bounds every field; the daemon, which knows the base's size, checks that the view lies
inside it (offset + sum((size - 1) * stride) below its elements; strides are never negative).
`Tensor.reshape`, `transpose`, `permute` and `narrow` make views with the geometry below, shared by
the client and the daemon. What takes which view: a kernel of the op library that reads through
strides takes any (its tensor bound whole, the view in its scalars); every other kernel takes a
contiguous view, bound at its offset where that is a multiple of VIEW_ALIGN bytes; copies and
uploads take contiguous views on 4-byte boundaries (`dense_range`); a readback takes any (`span`).
"""

from __future__ import annotations

import math
from typing import NamedTuple


class TensorView(NamedTuple):
    handle: int  # the base tensor's
    offset: int  # in elements, from the base's start
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # in elements, one per dimension


TensorRef = int | TensorView  # a tensor operand: a handle, or a view of one


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides (in elements) of a tensor of `shape`."""
    strides = []
    step = 1
    for dim in reversed(shape):
        strides.append(step)
        step *= max(dim, 1)
    return tuple(reversed(strides))


def is_contiguous(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """True if the elements are laid out row-major without gaps (dimensions of size 1 take any stride)."""
    step = 1
    for dim, stride in zip(reversed(shape), reversed(strides), strict=True):
        if dim != 1 and stride != step:
            return False
        step *= dim
    return True


def extent(view: TensorView) -> int:
    """Elements of the base from its start through the view's last element (`offset` when it is empty)."""
    if any(dim == 0 for dim in view.shape):
        return view.offset
    return view.offset + 1 + sum((dim - 1) * stride for dim, stride in zip(view.shape, view.strides, strict=True))


def view_of_shape(handle: int, shape: tuple[int, ...]) -> TensorView:
    """The whole tensor `handle`, contiguous, with `shape` (what `Tensor.reshape` sends)."""
    return TensorView(handle, 0, shape, contiguous_strides(shape))


# ---------------------------------------------------------------------- geometry (client and daemon)

VIEW_ALIGN = 256  # bytes: a dense view at an offset is bound there only on such a boundary (WebGPU's
# minStorageBufferOffsetAlignment is at most 256 on every adapter; CUDA takes the same rule, so a
# program behaves alike on both)
MAX_RANK = 6  # dimensions a strided view may keep after `coalesce` (what gpu.ops.contiguous takes)


def transposed(
    shape: tuple[int, ...], strides: tuple[int, ...], a: int, b: int
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Dimensions `a` and `b` swapped (negative counts from the end), as torch.transpose."""
    order = list(range(len(shape)))
    a, b = axis_index(a, len(shape)), axis_index(b, len(shape))
    order[a], order[b] = order[b], order[a]
    return permuted(shape, strides, order)


def permuted(
    shape: tuple[int, ...], strides: tuple[int, ...], dims: tuple[int, ...] | list[int]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The dimensions in the order `dims` (a permutation of them; negative counts from the end), as torch.permute."""
    order = [axis_index(d, len(shape)) for d in dims]
    if sorted(order) != list(range(len(shape))):
        raise ValueError(f"{list(dims)} is not a permutation of the {len(shape)} dimensions")
    return tuple(shape[d] for d in order), tuple(strides[d] for d in order)


def narrowed(
    shape: tuple[int, ...], strides: tuple[int, ...], offset: int, dim: int, start: int, length: int
) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """Elements [start, start + length) of dimension `dim` (start may be negative), as torch.narrow:
    (shape, strides, offset)."""
    dim = axis_index(dim, len(shape))
    size = shape[dim]
    if start < 0:
        start += size
    if not (0 <= start <= size and 0 <= length <= size - start):
        raise ValueError(f"[{start}, {start} + {length}) is not inside dimension {dim} of size {size}")
    new_shape = (*shape[:dim], length, *shape[dim + 1 :])
    return new_shape, strides, offset + (start * strides[dim] if length else 0)


def view_strides(shape: tuple[int, ...], strides: tuple[int, ...], new: tuple[int, ...]) -> tuple[int, ...] | None:
    """Strides of the same elements seen with shape `new` (as many elements), or None where that takes a
    copy: torch's rule for `view` (dimensions split or merged only where their strides chain)."""
    if is_contiguous(shape, strides) or math.prod(shape) == 0:
        return contiguous_strides(new)
    dims = [(d, s) for d, s in zip(shape, strides, strict=True) if d != 1]
    result = [0] * len(new)
    at = len(new) - 1
    i = len(dims) - 1
    while i >= 0:  # a chunk: dimensions whose strides chain, from the innermost
        base_stride, chunk = dims[i][1], dims[i][0]
        while i > 0 and dims[i - 1][1] == dims[i][1] * dims[i][0]:
            i -= 1
            chunk *= dims[i][0]
        seen = 1
        while at >= 0 and (seen < chunk or new[at] == 1):
            result[at] = seen * base_stride
            seen *= new[at]
            at -= 1
        if seen != chunk:
            return None
        i -= 1
    while at >= 0:  # leading dimensions of size 1
        if new[at] != 1:
            return None
        result[at] = 1
        at -= 1
    return tuple(result)


def coalesce(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The fewest dimensions walking the same elements in the same order: dimensions of size 1 dropped,
    neighbours whose strides chain merged. At least one dimension."""
    dims: list[list[int]] = []
    for size, stride in zip(shape, strides, strict=True):
        if size == 1:
            continue
        if dims and dims[-1][1] == stride * size:
            dims[-1] = [dims[-1][0] * size, stride]
        else:
            dims.append([size, stride])
    if not dims:
        dims = [[math.prod(shape), 1]]
    return tuple(d[0] for d in dims), tuple(d[1] for d in dims)


def axis_index(axis: int, ndim: int) -> int:
    """`axis` (negative counts from the end) checked to name one of `ndim` dimensions."""
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis {axis} is out of range for {ndim} dimensions")
    return axis + ndim if axis < 0 else axis


def span(offset: int, shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> tuple[int, int]:
    """(first byte, bytes) of the base that a readback of a view sends: from its first element, rounded
    down to 4 bytes (devices copy 4-byte words), through its last element; (0, 0) when it is empty."""
    view = TensorView(0, offset, shape, strides)
    if math.prod(shape) == 0:
        return 0, 0
    first = offset * itemsize // 4 * 4
    return first, extent(view) * itemsize - first


def dense_range(
    offset: int, shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int, base_elements: int
) -> tuple[int, int]:
    """(first byte, bytes) of a view that an upload or a copy writes or reads whole. Raises ValueError
    for what devices cannot copy exactly: a view that is not contiguous, or that starts off a 4-byte
    boundary, or ends off one short of its tensor's end (the copy would write a neighbour's bytes)."""
    if not is_contiguous(shape, strides):
        raise ValueError("it is a non-contiguous view: call gpu.ops.contiguous() on it first")
    count = math.prod(shape)
    first, nbytes = offset * itemsize, count * itemsize
    if count and (first % 4 or (nbytes % 4 and offset + count != base_elements)):
        raise ValueError(
            f"it is a view of bytes [{first}, {first + nbytes}) of its tensor, and copies move 4-byte words: "
            "its start, and its end unless it is the tensor's, must be multiples of 4 bytes"
        )
    return first, nbytes

"""Views: a tensor seen with another shape, without a handle of its own.

On the wire a tensor operand is either a handle (an int) or a view of one, the msgpack array
``[handle, offset, [shape...], [strides...]]``: the base tensor's handle, an element offset into it,
the view's shape and its element strides. A view costs the daemon nothing to hold (no handle, no
quota, nothing to free), and the same view sent again is the same key to every cache.

The codec bounds every field; the daemon, which knows the base's size, checks that the view lies
inside it. For now the daemon takes only the views `Tensor.reshape` makes: the whole tensor,
contiguous (offset 0, row-major strides). Offsets and other strides are in the form for
transposed, permuted and narrowed views to come, and refused until then.
"""

from __future__ import annotations

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

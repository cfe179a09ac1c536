"""What a session's tensors and a recording's have alike from their shape alone: numpy's `ndim` and
`size`, and torch's shape-only views, each a `reshape` (so, as it, no copy and no message): `view`,
`flatten`, `unsqueeze` and `squeeze`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol, Self, TypeVar

from gpud_client.errors import InvalidArgument


class Shaped(Protocol):
    shape: tuple[int, ...]

    def reshape(self, *shape: int | Sequence[int]) -> Self: ...


S = TypeVar("S", bound=Shaped)


class Reshapes:
    """Mixed into `Tensor` and `GraphTensor`, which define `shape` and `reshape`."""

    __slots__ = ()

    @property
    def ndim(self: Shaped) -> int:
        """Dimensions (numpy's `ndim`)."""
        return len(self.shape)

    @property
    def size(self: Shaped) -> int:
        """Elements (numpy's `size`; `nbytes` counts bytes)."""
        return math.prod(self.shape)

    def view(self: S, *shape: int | Sequence[int]) -> S:
        """torch's `view`: this memory with another shape (one dimension may be -1), as `reshape`."""
        return self.reshape(*shape)

    def flatten(self: S) -> S:
        """Every element along one axis, as torch's `flatten()`: a view (a view whose strides do not
        allow it says to call `gpu.ops.contiguous(t)` first; numpy's `flatten` would copy)."""
        return self.reshape(-1)

    def unsqueeze(self: S, dim: int) -> S:
        """An axis of size 1 inserted at `dim` (negative: from the end of the result), as torch's."""
        ndim = len(self.shape)
        if not -ndim - 1 <= dim <= ndim:
            raise InvalidArgument(
                f"dim {dim} is out of range for a {ndim}-d tensor ([{-ndim - 1}, {ndim}])", op="unsqueeze"
            )
        at = dim % (ndim + 1)
        return self.reshape((*self.shape[:at], 1, *self.shape[at:]))

    def squeeze(self: S, dim: int | Sequence[int] | None = None) -> S:
        """The axes of size 1 removed (all of them, or those of `dim` that are 1, as torch's: an axis
        named that is not of size 1 stays)."""
        ndim = len(self.shape)
        named = range(ndim) if dim is None else [dim] if isinstance(dim, int) else list(dim)
        drop = set()
        for d in named:
            if not -max(ndim, 1) <= d < max(ndim, 1):
                raise InvalidArgument(f"dim {d} is out of range for a {ndim}-d tensor", op="squeeze")
            if ndim and self.shape[d % ndim] == 1:
                drop.add(d % ndim)
        return self.reshape(tuple(size for axis, size in enumerate(self.shape) if axis not in drop))


__all__ = ["Reshapes"]

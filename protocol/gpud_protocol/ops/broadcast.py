"""numpy broadcasting, and the compact form in which the elementwise kernels receive it.

The kernels index each operand from the output's index: they walk the output's axes from the last,
and an operand advances along an axis unless it is broadcast there (size 1). Adjacent axes that every
operand treats alike merge first (a same-shape op is one axis; `[5, 384] + [384]` two), so the common
cases cost one or two divisions, and at most MAX_RANK merged axes remain: they travel as `rank`,
the sizes `d0..d5` (1 past `rank`) and, per operand, a mask of the merged axes it is broadcast over
(bit k: axis k, counted from the outermost).
"""

from __future__ import annotations

import math
from typing import NamedTuple

from gpud_protocol.ops import OpError

MAX_RANK = 6  # merged axes the kernels walk
DIMS = tuple(f"d{k}" for k in range(MAX_RANK))


class BroadcastLayout(NamedTuple):
    rank: int
    dims: tuple[int, ...]  # MAX_RANK sizes, 1 past rank
    masks: tuple[int, ...]  # per operand: bit k set where it is broadcast over merged axis k

    def scalars(self) -> list[int]:
        """rank, d0..d5, then one mask per operand: the order of the kernels' scalars."""
        return [self.rank, *self.dims, *self.masks]


def broadcast_shapes(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """numpy's broadcast shape: shapes aligned at their last axes, each axis equal or 1."""
    ndim = max(len(s) for s in shapes)
    result = []
    for axis in range(ndim):
        sizes = {s[axis - ndim + len(s)] for s in shapes if axis - ndim + len(s) >= 0}
        others = sizes - {1}
        if len(others) > 1:
            listed = " and ".join(str(list(s)) for s in shapes)
            raise OpError(f"shapes {listed} do not broadcast (axis {axis - ndim}: sizes {sorted(sizes)})")
        result.append(others.pop() if others else 1)
    return tuple(result)


def broadcast_layout(out: tuple[int, ...], *operands: tuple[int, ...]) -> BroadcastLayout:
    """The merged axes of an op writing `out` from `operands` (each broadcasting to `out`)."""
    if broadcast_shapes(out, *operands) != out:
        raise OpError(f"operands {[list(s) for s in operands]} do not broadcast to out {list(out)}")
    aligned = [(1,) * (len(out) - len(s)) + tuple(s) for s in operands]
    merged: list[tuple[int, tuple[bool, ...]]] = []
    for axis, size in enumerate(out):
        if size == 1:
            continue  # every operand is 1 there too
        pattern = tuple(s[axis] == 1 for s in aligned)
        if merged and merged[-1][1] == pattern:
            merged[-1] = (merged[-1][0] * size, pattern)
        else:
            merged.append((size, pattern))
    if math.prod(out) == 0:
        merged = []  # nothing to write
    if len(merged) > MAX_RANK:
        raise OpError(
            f"operands {[list(s) for s in operands]} broadcast to {list(out)} over {len(merged)} alternating "
            f"groups of axes; at most {MAX_RANK} are supported (make one operand contiguous at full shape first)"
        )
    merged = merged or [(1, tuple(False for _ in operands))]
    dims = tuple(size for size, _ in merged) + (1,) * (MAX_RANK - len(merged))
    masks = tuple(sum(1 << k for k, (_, pattern) in enumerate(merged) if pattern[i]) for i in range(len(operands)))
    return BroadcastLayout(len(merged), dims, masks)

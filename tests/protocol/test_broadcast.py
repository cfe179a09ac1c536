"""numpy broadcasting as the elementwise kernels receive it (gpud_protocol.ops.broadcast): the kernels'
index walk, written here in Python, against numpy's broadcast_to over many random shapes."""

from __future__ import annotations

import numpy as np
import pytest

from gpud_protocol.ops import OpError
from gpud_protocol.ops.broadcast import MAX_RANK, BroadcastLayout, broadcast_layout, broadcast_shapes


def offsets(e: int, lay: BroadcastLayout) -> list[int]:
    """Each operand's element index for output element e: what elementwise.wgsl/.cu compute."""
    rem, off, stride = e, [0] * len(lay.masks), [1] * len(lay.masks)
    for k in reversed(range(lay.rank)):
        size = lay.dims[k]
        coord, rem = rem % size, rem // size
        for o, mask in enumerate(lay.masks):
            if not (mask >> k) & 1:
                off[o] += coord * stride[o]
                stride[o] *= size
    return off


def random_shapes(rng: np.random.Generator, count: int) -> list[tuple[int, ...]]:
    """Shapes that broadcast together: a full shape, each operand with some axes 1 and some leading
    axes dropped."""
    ndim = int(rng.integers(0, 7))
    full = tuple(int(d) for d in rng.integers(1, 5, ndim))
    shapes = []
    for _ in range(count):
        shape = tuple(1 if rng.random() < 0.4 else d for d in full)
        shapes.append(shape[int(rng.integers(0, ndim + 1)) :])
    return shapes


@pytest.mark.parametrize("operands", [2, 3])
def test_the_kernels_index_walk_is_numpy_broadcasting(operands: int) -> None:
    rng = np.random.default_rng(7)
    for _ in range(300):
        shapes = random_shapes(rng, operands)
        out = broadcast_shapes(*shapes)
        assert out == np.broadcast_shapes(*shapes)
        lay = broadcast_layout(out, *shapes)
        assert 1 <= lay.rank <= MAX_RANK and len(lay.dims) == MAX_RANK
        assert all(d == 1 for d in lay.dims[lay.rank :])
        arrays = [np.arange(int(np.prod(s))).reshape(s) for s in shapes]
        expect = [np.broadcast_to(a, out).reshape(-1) for a in arrays]
        for e in range(int(np.prod(out))):
            assert offsets(e, lay) == [int(x[e]) for x in expect], (shapes, out, lay)


def test_common_cases_merge_to_one_or_two_axes() -> None:
    assert broadcast_layout((5, 384), (5, 384), (5, 384)) == ((1, (1920, 1, 1, 1, 1, 1), (0, 0)))
    assert broadcast_layout((5, 384), (5, 384), (1, 384)) == ((2, (5, 384, 1, 1, 1, 1), (0, 1)))
    assert broadcast_layout((5, 384), (5, 384), (384,)) == ((2, (5, 384, 1, 1, 1, 1), (0, 1)))
    assert broadcast_layout((2, 3, 4), (2, 3, 4), (2, 3, 1)) == ((2, (6, 4, 1, 1, 1, 1), (0, 2)))
    assert broadcast_layout((), (), ()) == ((1, (1, 1, 1, 1, 1, 1), (0, 0)))


def test_shapes_that_do_not_broadcast_and_too_many_alternations() -> None:
    with pytest.raises(OpError, match=r"do not broadcast \(axis -1: sizes \[3, 4\]\)"):
        broadcast_shapes((2, 3), (4,))
    with pytest.raises(OpError, match="do not broadcast to out"):
        broadcast_layout((3,), (2, 3))  # numpy's out= may not be smaller than the inputs' shape
    alternating = (2, 1) * 4
    with pytest.raises(OpError, match="8 alternating groups of axes; at most 6"):
        broadcast_layout((2,) * 8, alternating, (*alternating[1:], 1))

"""Layout: `contiguous`, the copy of any view (transposed, permuted, narrowed...) into dense memory.

contiguous_<b>(x, out; n, offset, size0..size5, stride0..stride5): out (dense, x's shape and dtype) =
    the view's elements in row-major order. The view is given by its element offset into x's tensor
    (bound whole) and its dimensions after `views.coalesce`, padded in front with size 1, stride 0
    to MAX_RANK. <b> is the element size in bits (8, 16, 32, 64): the kernel moves bits, any dtype.

WebGPU addresses memory in 4-byte words: the 8- and 16-bit kernels give each thread one output word
(4 or 2 elements), and the last word, when the elements end inside it, keeps its other bytes (out may
be a dense view with a neighbour after it). The 32- and 64-bit kernels give each thread one element.
Grids are 1-D over those units, 256 threads per workgroup, folded into y past 65,535 workgroups.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from gpud_protocol.limits import DTYPE_SIZES
from gpud_protocol.ops import KernelSpec, TensorInfo, grid_1d, need
from gpud_protocol.views import MAX_RANK, coalesce

FAMILY = "layout"
BITS = (8, 16, 32, 64)
PER_THREAD = {8: 4, 16: 2, 32: 1, 64: 1}  # elements each thread writes


def kernel_name(dtype: str) -> str:
    return f"contiguous_b{8 * DTYPE_SIZES[dtype]}"


def geometry(x: TensorInfo) -> list[int]:
    """The scalars after n that describe x: offset, then MAX_RANK sizes and MAX_RANK strides."""
    sizes, strides = coalesce(x.shape, x.steps)
    need(len(sizes) <= MAX_RANK, f"x is a view of {len(sizes)} dimensions that do not merge; at most {MAX_RANK}")
    pad = MAX_RANK - len(sizes)
    return [x.offset, *([1] * pad), *sizes, *([0] * pad), *strides]


def grid(n: int, dtype: str) -> tuple[int, int, int]:
    return grid_1d(-(-n // PER_THREAD[8 * DTYPE_SIZES[dtype]]))


def _contiguous(bits: int) -> KernelSpec:
    def check(t: Sequence[TensorInfo], s: Sequence[int | float]) -> None:
        x, out = t
        need(8 * DTYPE_SIZES.get(x.dtype, 0) == bits, f"x is {x.dtype}, this kernel moves {bits}-bit elements")
        need(out.dtype == x.dtype, f"out is {out.dtype}, x is {x.dtype}")
        need(out.shape == x.shape, f"out is {list(out.shape)}, x is {list(x.shape)}")
        n, *rest = s
        need(n == math.prod(x.shape), f"n passed ({n}) is not x's {math.prod(x.shape)} elements")
        want = geometry(x)
        need(list(rest) == want, f"the view passed {list(rest)} is not x's (offset, sizes, strides): {want}")

    sizes = tuple((f"size{i}", "u32") for i in range(MAX_RANK))
    strides = tuple((f"stride{i}", "u32") for i in range(MAX_RANK))
    scalars = (("n", "u32"), ("offset", "u32"), *sizes, *strides)
    return KernelSpec(f"contiguous_b{bits}", FAMILY, "contiguous", ("x", "out"), (1,), scalars, check, strided=(0,))


SPECS = [_contiguous(bits) for bits in BITS]

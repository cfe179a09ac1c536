"""layernorm_warp_<x>_<w>: layernorm's tensors, scalars and rule (gpud_protocol.ops.reduce) for rows of at
most WARP_ROW_MAX elements, one warp a row and ROWS_PER_BLOCK rows a block of 256 threads, each row read
once into registers and summed by warp shuffles (CUDA, gpud/ops/reduce.cu). Grid: warp_grid(rows), the
blocks folded into y past 65,535. The client picks it on the cuda backend wherever a row fits: the row
kernels' block of 256 threads per row took 44 us a launch over MiniLM's 15,360 rows of 384 float16 on an
H100, against torch's 31 (Nsight Compute, h100/session6/ncu-embed-ew16.csv).

add_layernorm_warp_<x>_<w>(x, r, weight, bias, out; rows, length, eps): layernorm_warp over x + r, the sum
rounded to x's dtype first as `add` stores it (so the bits of add then layernorm_warp, in one launch: a
post-LN transformer's residual add and norm); r of x's shape and dtype.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from gpud_protocol.ops import KernelSpec, TensorInfo, grid_1d, need
from gpud_protocol.ops.reduce import SPECS as ROW_SPECS

WARP_ROW_MAX = 1024  # elements a row: 32 a lane, in registers
ROWS_PER_BLOCK = 8  # warps of a block of 256 threads


def warp_applies(length: int) -> bool:
    """Whether a row of `length` elements fits a warp."""
    return 1 <= length <= WARP_ROW_MAX


def warp_grid(rows: int) -> tuple[int, int, int]:
    """A block of ROWS_PER_BLOCK rows, folded into y past 65,535 blocks."""
    return grid_1d(-(-rows // ROWS_PER_BLOCK), 1)


def _fits(name: str, length: int | float) -> None:
    need(warp_applies(int(length)), f"{name} keeps a row in a warp's registers: at most {WARP_ROW_MAX}, not {length}")


def _warp(row: KernelSpec) -> KernelSpec:
    name = row.name.replace("layernorm_", "layernorm_warp_", 1)

    def check(t: Sequence[TensorInfo], s: Sequence[int | float]) -> None:
        row.check(t, s)
        _fits(name, s[1])

    return dataclasses.replace(row, name=name, check=check)


def _add_warp(row: KernelSpec) -> KernelSpec:
    """layernorm's row spec with r after x: x, r, weight, bias, out."""
    name = row.name.replace("layernorm_", "add_layernorm_warp_", 1)

    def check(t: Sequence[TensorInfo], s: Sequence[int | float]) -> None:
        x, r, *rest = t
        need(r.dtype == x.dtype, f"{name} adds r to x in x's dtype: r is {r.dtype}, x is {x.dtype}")
        need(r.shape == x.shape, f"{name} adds r to x: r is {list(r.shape)}, x is {list(x.shape)}")
        row.check([x, *rest], s)
        _fits(name, s[1])

    tensors = ("x", "r", *row.tensors[1:])
    return dataclasses.replace(row, name=name, tensors=tensors, writes=(len(tensors) - 1,), check=check)


BACKENDS = ("cuda",)  # the backends whose sources have these kernels

_LAYERNORMS = [spec for spec in ROW_SPECS if spec.name.startswith("layernorm_")]
SPECS = [*(_warp(spec) for spec in _LAYERNORMS), *(_add_warp(spec) for spec in _LAYERNORMS)]

"""Row kernels for CPU-backed WebGPU adapters (lavapipe; family rows: gpud/ops/rows.wgsl, WebGPU only).

layernorm_rows_<x>_<w>(x, weight, bias, out; rows, length, eps): layernorm_<x>_<w>'s tensors, scalars,
    output and rule (gpud_protocol.ops.reduce), restricted by `rows_apply` to rows whose length is a
    multiple of ROW_STEP and whose three loops (length / ROW_STEP iterations each) lavapipe runs whole:
    its budget of MAX_LOOP iterations is one per invocation, loops one after the other included
    (`row_loops`). One thread per row, ROWS_THREADS to a workgroup: grid `rows_grid` (folded into y past
    65,535 workgroups; the kernel's row is gid.x + gid.y * num_workgroups.x * ROWS_THREADS).
The client picks them on a software adapter (a device whose info says "software"), where the reduce
family's workgroup-per-row trees spend most of their time in barriers; GPUs keep those.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from gpud_protocol.ops import KernelSpec, TensorInfo, grid_1d, need
from gpud_protocol.ops.attention import MAX_LOOP
from gpud_protocol.ops.reduce import DTYPES, SHORT
from gpud_protocol.ops.reduce import SPECS as REDUCE_SPECS

ROW_STEP = 8  # elements of a row per load
ROW_PASSES = 3  # loops over a row, one after the other
ROWS_THREADS = 64  # threads (rows) per workgroup
FAMILY = "rows"


def rows_apply(length: int) -> bool:
    """Whether the row kernels take rows of `length` elements."""
    return length % ROW_STEP == 0 and row_loops(length) <= MAX_LOOP


def row_loops(length: int) -> int:
    """Lavapipe's count of a thread's loop iterations over a row of `length`: each loop after the first
    counts one more than it runs (measured: three loops of 21,845 iterations lose the third's last two)."""
    return ROW_PASSES * (length // ROW_STEP) + ROW_PASSES - 1


def rows_grid(rows: int) -> tuple[int, int, int]:
    return grid_1d(rows, ROWS_THREADS)


def _spec(generic: KernelSpec, name: str) -> KernelSpec:
    def check(t: Sequence[TensorInfo], s: Sequence[int | float]) -> None:
        generic.check(t, s)
        length = int(s[1])
        most = ROW_STEP * ((MAX_LOOP - ROW_PASSES + 1) // ROW_PASSES)
        need(rows_apply(length), f"takes rows a multiple of {ROW_STEP} long, up to {most}, not {length}")

    return dataclasses.replace(generic, name=name, family=FAMILY, check=check, block=ROWS_THREADS)


_GENERIC = {spec.name: spec for spec in REDUCE_SPECS}
BACKENDS = ("webgpu",)  # the backends whose sources have these kernels

SPECS = [
    _spec(_GENERIC[f"layernorm_{SHORT[x]}_{SHORT[w]}"], f"layernorm_rows_{SHORT[x]}_{SHORT[w]}")
    for x in DTYPES
    for w in DTYPES
]

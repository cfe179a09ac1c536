"""Matrix products for CPU-backed WebGPU adapters (lavapipe): w as (N, K), K a multiple of 8.

`matmul_nk_<x>_<w>` for the (x, w) pairs of matmul's PAIRS: matmul_<x>_<w>'s tensors, scalars, out
dtype and rule (gpud_protocol.ops.matmul), restricted to wt = 1 (a Linear's weight) and a K that
`nk_applies` to. A workgroup of NK_THREADS threads computes an NK_TILE x NK_TILE tile of out, each
thread an NK_BLOCK x NK_BLOCK block of dot products of rows of x and w read straight from the operands
8 K-elements at a time, with no workgroup memory and no barrier (gpud/ops/matmul.wgsl says why that
suits lavapipe). Grid: nk_grid, (ceil(N / NK_TILE), ceil(M / NK_TILE), batch). WebGPU only (the CUDA
sources have none of these); the client picks them on a software adapter (a device whose info says
"software"), where they run ~4x the tiled kernel's rate, and keeps matmul_<x>_<w> on GPUs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from gpud_protocol.ops import MAX_GROUPS, KernelSpec, TensorInfo, need
from gpud_protocol.ops.attention import MAX_LOOP
from gpud_protocol.ops.matmul import PAIRS, SHORT
from gpud_protocol.ops.matmul import SPECS as MATMUL_SPECS

NK_BLOCK = 12  # rows (and columns) of out per thread
NK_TILE = 96  # rows (and columns) of out per workgroup: 8 x 8 threads
NK_THREADS = 64
NK_STEP = 8  # K-elements per load: K must be a multiple of it


def nk_applies(k: int, wt: bool) -> bool:
    """Whether matmul_nk takes a product over `k`: w as (N, K), K a multiple of NK_STEP, and its K loop
    (K / NK_STEP iterations) within lavapipe's MAX_LOOP."""
    return wt and k % NK_STEP == 0 and k // NK_STEP <= MAX_LOOP


def nk_grid(batch: int, m: int, n: int) -> tuple[int, int, int]:
    grid = (-(-n // NK_TILE), -(-m // NK_TILE), batch)
    need(max(grid) <= MAX_GROUPS, f"M={m}, N={n}, batch {batch}: more than {MAX_GROUPS} workgroups along an axis")
    return grid


def _spec(tiled: KernelSpec, x_dtype: str, w_dtype: str) -> KernelSpec:
    def check(t: Sequence[TensorInfo], s: Sequence[int | float]) -> None:
        tiled.check(t, s)
        k, wt = int(s[3]), int(s[6])
        need(wt == 1, f"takes w as (N, K) only (wt 1), not wt {wt}")
        need(nk_applies(k, True), f"takes K a multiple of {NK_STEP} up to {NK_STEP * MAX_LOOP}, not K={k}")

    name = f"matmul_nk_{SHORT[x_dtype]}_{SHORT[w_dtype]}"
    return dataclasses.replace(tiled, name=name, check=check, block=NK_THREADS)


_TILED = {spec.name: spec for spec in MATMUL_SPECS}
BACKENDS = ("webgpu",)  # the backends whose sources have these kernels

SPECS = [_spec(_TILED[f"matmul_{SHORT[x]}_{SHORT[w]}"], x, w) for x, w in PAIRS]

"""attention_cpu: full attention in one pass for CPU-backed WebGPU adapters (lavapipe; family attention_cpu:
gpud/ops/attention_cpu.wgsl, WebGPU only).

attention_cpu_d<W>_<q>_<kv>_<out>(q, k, v, mask, out; b, t, s, hq, hkv, d, causal, mask_mode, scale), for W in
    CPU_HEAD_DIMS and (q, kv, out) in TILED_DTYPES: attention_tiled_d<W>_<q>_<kv>_<out>'s tensors, scalars and
    rule (gpud_protocol.ops.attention_tiled) for a head dim D equal to W, no mask or a key mask (mask_mode 0, 3
    to 6; an additive mask goes to attention_tiled), causal or not. A thread computes CPU_ROWS query rows of
    one (batch row, head) with no workgroup memory and no barrier (the WGSL says why that suits lavapipe),
    CPU_THREADS threads a workgroup: grid `cpu_grid`, one thread per (block of CPU_ROWS rows, head, batch
    row), folded into y past 65,535 workgroups. Its loop over the keys makes ceil(S / 2) iterations.
The client picks these on a software adapter (a device whose info says "software"), where they run ~6x
attention_tiled's rate on MiniLM's heads; GPUs keep attention_tiled.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from gpud_protocol.ops import KernelSpec, TensorInfo, grid_1d, need
from gpud_protocol.ops.attention import MAX_LOOP, SHORT
from gpud_protocol.ops.attention_tiled import SPECS as TILED_SPECS
from gpud_protocol.ops.attention_tiled import TILED_DTYPES, tiled_applies

CPU_HEAD_DIMS = (32, 64)
CPU_ROWS = 4  # query rows per thread
CPU_THREADS = 64
FAMILY = "attention_cpu"
ADDITIVE = (1, 2)  # mask modes of an additive mask: not taken


def cpu_name(q_dtype: str, kv_dtype: str, out_dtype: str, dim: int) -> str:
    return f"attention_cpu_d{dim}_{SHORT[q_dtype]}_{SHORT[kv_dtype]}_{SHORT[out_dtype]}"


def cpu_applies(q: TensorInfo, k: TensorInfo, v_dtype: str, out_dtype: str, additive: bool) -> bool:
    """Whether attention_cpu computes this attention: what attention_tiled takes, with D one of
    CPU_HEAD_DIMS, no additive mask, and ceil(S / 2) keys' loop iterations within lavapipe's budget."""
    return (
        not additive
        and tiled_applies(q, k, v_dtype, out_dtype)
        and q.shape[-1] in CPU_HEAD_DIMS
        and -(-k.shape[1] // 2) <= MAX_LOOP
    )


def cpu_grid(batch: int, steps: int, heads: int) -> tuple[int, int, int]:
    return grid_1d(-(-steps // CPU_ROWS) * heads * batch, CPU_THREADS)


def _spec(tiled: KernelSpec, width: int, name: str) -> KernelSpec:
    def check(t: Sequence[TensorInfo], s: Sequence[int | float]) -> None:
        tiled.check(t, s)
        d, mode, keys = int(s[5]), int(s[7]), int(s[2])
        need(d == width, f"takes a head dim of {width}, not {d}")
        need(mode not in ADDITIVE, "takes a key mask or none, not an additive mask (attention_tiled does)")
        need(-(-keys // 2) <= MAX_LOOP, f"{keys} keys: past the loop budget of this kernel")

    return dataclasses.replace(tiled, name=name, family=FAMILY, check=check, block=CPU_THREADS)


_TILED = {spec.name: spec for spec in TILED_SPECS}
BACKENDS = ("webgpu",)  # the backends whose sources have these kernels

SPECS = [
    _spec(_TILED[f"attention_tiled_d{w}_{SHORT[q]}_{SHORT[kv]}_{SHORT[o]}"], w, cpu_name(q, kv, o, w))
    for w in CPU_HEAD_DIMS
    for q, kv, o in TILED_DTYPES
]

"""layernorm_warp, CUDA's layernorm of a warp a row: against numpy float64 at every dtype pair, on row
lengths around a warp's and its limit, row counts that leave a block's warps idle and that fold the grid;
which calls the client sends there (and past the limit, to the row kernels); and the rule, without a GPU.
"""

from __future__ import annotations

import pytest

import gpud_client
from gpud_protocol.ops import KERNELS, OpError, TensorInfo
from gpud_protocol.ops.reduce_warp import ROWS_PER_BLOCK, WARP_ROW_MAX, warp_applies, warp_grid
from ops.test_reduce import DTYPES, close_norm, layernorm_ref, poisoned, random


def cuda_only(gpu: gpud_client.Client) -> None:
    if gpu.backend != "cuda":
        pytest.skip("layernorm_warp is CUDA's")


@pytest.mark.parametrize("wdtype", DTYPES)
@pytest.mark.parametrize("dtype", DTYPES)
async def test_layernorm_a_warp_a_row(gpu: gpud_client.Client, dtype: str, wdtype: str) -> None:
    cuda_only(gpu)
    for shape in [(3, 1), (5, 31), (9, 32), (2, 7, 33), (13, 384), (17, 1000), (4, WARP_ROW_MAX)]:
        a = random(shape, dtype, 0.5, 60.0)  # a mean far from 0 beside a small spread
        w, b = random(shape[-1:], wdtype, 1.0, 1.0), random(shape[-1:], wdtype)
        out = poisoned(gpu, shape, dtype)
        gpu.ops.layernorm(gpu.tensor(a), gpu.tensor(w), gpu.tensor(b), eps=1e-4, out=out)
        ref, slack = layernorm_ref(a, w, b, 1e-4)
        close_norm(await out.numpy(), ref, dtype, slack)
    assert any(name.startswith("layernorm_warp_") for name in gpu.ops._kernels)


async def test_many_rows_and_the_limit(gpu: gpud_client.Client) -> None:
    cuda_only(gpu)
    for shape in [(70_000 * ROWS_PER_BLOCK + 3, 8), (3, WARP_ROW_MAX + 1)]:  # a folded grid; past a warp
        a = random(shape, "float32", 0.5, 2.0)
        w, b = random(shape[-1:], "float32", 1.0, 1.0), random(shape[-1:], "float32")
        got = await gpu.ops.layernorm(gpu.tensor(a), gpu.tensor(w), gpu.tensor(b)).numpy()
        ref, slack = layernorm_ref(a, w, b, 1e-5)
        close_norm(got, ref, "float32", slack)
    assert {"layernorm_warp_f32_f32", "layernorm_f32_f32"} <= set(gpu.ops._kernels)


def test_the_rule_and_the_grid() -> None:
    assert warp_applies(1) and warp_applies(WARP_ROW_MAX) and not warp_applies(WARP_ROW_MAX + 1)
    assert warp_grid(1) == (1, 1, 1) and warp_grid(17) == (3, 1, 1)
    assert warp_grid(65_535 * ROWS_PER_BLOCK + 1) == (65_535, 2, 1)
    x, w = TensorInfo("float16", (4, WARP_ROW_MAX + 8)), TensorInfo("float32", (WARP_ROW_MAX + 8,))
    spec = KERNELS["layernorm_warp_f16_f32"]
    with pytest.raises(OpError, match=r"layernorm_warp_f16_f32 keeps a row in a warp's registers: at most 1024"):
        spec.verify([x, w, w, x], [4, WARP_ROW_MAX + 8, 1e-5])
    ok, wk = TensorInfo("float16", (4, 384)), TensorInfo("float32", (384,))
    spec.verify([ok, wk, wk, ok], [4, 384, 1e-5])
    assert spec.block == KERNELS["layernorm_f16_f32"].block == 32 * ROWS_PER_BLOCK

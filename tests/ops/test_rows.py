"""layernorm_rows, the layernorm lavapipe runs (a thread per row, rows a multiple of 8 long), against numpy in
float64: every dtype of x and of weight and bias (bfloat16 too), row counts off the workgroup's 64, a mean
far from 0 next to a small spread in long rows (float32 sums lose the mean's low bits), the longest row the
rule takes (three loops of 21,844 iterations: lavapipe's budget of 65,535 a thread, each loop after the first
counting one more) whose last elements decide the result, poisoned outputs, which calls the
client sends to it, and the rule (client and daemon). Tolerances: test_reduce.py's and, for bfloat16,
test_bfloat16_reduce.py's.
"""

from __future__ import annotations

import numpy as np
import pytest

import gpud_client
from gpud_client import InvalidArgument, u32
from gpud_protocol.ops import KERNELS, OpError, TensorInfo
from gpud_protocol.ops.attention import MAX_LOOP
from gpud_protocol.ops.rows import ROW_STEP, row_loops, rows_apply, rows_grid
from ops.test_attention_tiled import software
from ops.test_bfloat16_reduce import close, rand, tensor
from ops.test_reduce import layernorm_ref

FLOATS = ["float32", "float16", "bfloat16"]
SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}
SHAPES = [(1, 8), (65, 24), (2, 3, 384), (3, 896)]  # one row; past one workgroup's 64; 3-D; long rows


def cpu_only(gpu: gpud_client.Client) -> None:
    if not software(gpu):
        pytest.skip("layernorm_rows is a software adapter's (lavapipe)")


def poisoned(gpu: gpud_client.Client, shape: tuple[int, ...], dtype: str) -> gpud_client.Tensor:
    return tensor(gpu, np.full(shape, np.nan, np.float32), dtype)


@pytest.mark.parametrize("w_dtype", FLOATS)
@pytest.mark.parametrize("x_dtype", FLOATS)
async def test_every_dtype_and_row_count(gpu: gpud_client.Client, x_dtype: str, w_dtype: str) -> None:
    cpu_only(gpu)
    for shape in SHAPES:
        a = rand(shape, 0.5, 3.0)  # exact in every dtype: a mean away from 0
        w, b = rand(shape[-1:], 1.0, 1.0), rand(shape[-1:])
        out = poisoned(gpu, shape, x_dtype)
        gpu.ops.layernorm(tensor(gpu, a, x_dtype), tensor(gpu, w, w_dtype), tensor(gpu, b, w_dtype), 1e-5, out=out)
        ref, slack = layernorm_ref(a, w, b, 1e-5)
        close(await out.numpy(), ref, x_dtype, slack)
    assert set(gpu.ops._kernels) == {f"layernorm_rows_{SHORT[x_dtype]}_{SHORT[w_dtype]}"}


async def test_a_far_mean_and_the_longest_row(gpu: gpud_client.Client) -> None:
    """Mean 60, spread 0.5, 70,000 elements: a plain float32 sum of x misses the mean by ~1e-4; then the
    longest row the rule takes (its three loops use lavapipe's whole budget), whose last 8 elements are
    1,000 times the others."""
    cpu_only(gpu)
    rng = np.random.default_rng()
    longest = ROW_STEP * 21_844
    assert row_loops(longest) == MAX_LOOP - 1 and row_loops(longest + ROW_STEP) > MAX_LOOP
    for length, tail in [(70_000, 1.0), (longest, 1000.0)]:
        a = (rng.standard_normal((2, length)) * 0.5 + 60.0).astype(np.float32)
        a[:, -ROW_STEP:] *= tail  # a loop cut short would miss these: a wrong mean and variance everywhere
        w, b = np.ones(length, np.float32), np.zeros(length, np.float32)
        out = poisoned(gpu, a.shape, "float32")
        gpu.ops.layernorm(gpu.tensor(a), gpu.tensor(w), gpu.tensor(b), 1e-5, out=out)
        ref, slack = layernorm_ref(a, w, b, 1e-5)
        close(await out.numpy(), ref, "float32", slack)
    assert rows_apply(longest) and not rows_apply(longest + ROW_STEP)
    assert set(gpu.ops._kernels) == {"layernorm_rows_f32_f32"}


async def test_rows_off_8_go_to_the_reduce_kernel(gpu: gpud_client.Client) -> None:
    cpu_only(gpu)
    a, w, b = rand((5, 12), 1.0, 0.5), rand((12,)), rand((12,))
    got = await gpu.ops.layernorm(gpu.tensor(a), gpu.tensor(w), gpu.tensor(b), 1e-5).numpy()
    ref, slack = layernorm_ref(a, w, b, 1e-5)
    close(got, ref, "float32", slack)
    assert set(gpu.ops._kernels) == {"layernorm_f32_f32"}


async def test_the_daemon_checks_a_rows_dispatch(gpu: gpud_client.Client) -> None:
    """A client that skips the library's choice: a row length off 8 is a typed error; the session goes on."""
    cpu_only(gpu)
    kernel = gpu.ops._kernel("layernorm_rows_f32_f32")
    x, w, out = gpu.tensor(np.ones((3, 12), np.float32)), gpu.tensor(np.ones(12, np.float32)), gpu.empty((3, 12))
    gpu.dispatch(kernel, rows_grid(3), [x, w, w, out, u32(3), u32(12), 1e-5])
    with pytest.raises(InvalidArgument, match="multiple of 8"):
        await out.numpy()
    x8, w8, out8 = gpu.tensor(np.ones((3, 8), np.float32)), gpu.tensor(np.ones(8, np.float32)), gpu.empty((3, 8))
    gpu.dispatch(kernel, rows_grid(3), [x8, w8, w8, out8, u32(3), u32(8), 1e-5])
    np.testing.assert_array_equal(await out8.numpy(), np.ones((3, 8), np.float32))  # (x - mean) * 0 + bias


def test_the_rule() -> None:
    check = KERNELS["layernorm_rows_f16_bf16"].check
    x, w = TensorInfo("float16", (4, 16)), TensorInfo("bfloat16", (16,))
    check([x, w, w, x], [4, 16, 1e-5])
    with pytest.raises(OpError, match="multiple of 8"):
        x12 = TensorInfo("float16", (4, 12))
        check([x12, TensorInfo("bfloat16", (12,)), TensorInfo("bfloat16", (12,)), x12], [4, 12, 1e-5])
    with pytest.raises(OpError, match="weight is float16"):
        check([x, TensorInfo("float16", (16,)), w, x], [4, 16, 1e-5])
    assert rows_grid(64) == (1, 1, 1) and rows_grid(65) == (2, 1, 1) and rows_grid(64 * 65_536)[1] == 2
    names = {name for name in KERNELS if name.startswith("layernorm_rows_")}
    assert names == {f"layernorm_rows_{SHORT[a]}_{SHORT[b]}" for a in FLOATS for b in FLOATS}

"""The float16 and bfloat16 matmuls on the tensor cores (matmul_tc<BM>x<BN>_f16_f16 and _bf16_bf16, CUDA
only) against numpy in float64: every tile at sizes off its tile and off 16-byte rows (K not a multiple
of 8, N odd), both layouts of w, batches, biases of every float dtype, a long K, the decoder's prefill
shapes through the op; the tile choice and grids as pure functions; and on WebGPU, which has no such
kernels, a typed refusal. Tolerances as in test_matmul.py (1e-5 of the row's magnitude plus 2e-3 of
|ref| for the float16 out) and test_matmul_bf16.py (the bfloat16 out between the roundings of ref
-+ 1e-5 of the magnitude): the products of 16-bit floats are exact and the tensor cores sum them in
float32."""

from __future__ import annotations

import numpy as np
import pytest

import gpud_client
from gpud_client import InvalidArgument, u32
from gpud_protocol.ops import KERNELS, MAX_GROUPS, OpError, TensorInfo
from gpud_protocol.ops.matmul import BIAS_KINDS, TC_KERNELS, TC_TILES, plan, tc_grid, tc_kernel, tc_name
from ops.test_matmul import DECODE, close, rand
from ops.test_matmul_bf16 import check, upload
from ops.test_matmul_bf16 import rand as rand_of

# (batch, M, N, K, wt, bias dtype, batched w)
EDGES = [
    (1, 17, 33, 70, True, None, False),
    (1, 33, 31, 64, False, "float32", False),
    (1, 130, 136, 200, False, "float16", False),
    (1, 70, 66, 40, True, "bfloat16", False),
    (2, 40, 72, 136, True, "float32", True),
    (3, 20, 48, 96, False, None, True),
    (3, 7, 40, 24, True, "float16", False),  # a shared w: the batches fold into 21 rows
    (1, 9, 8, 16, True, "float16", False),
    (1, 1, 5, 3, False, None, False),
    (1, 150, 40, 1000, True, None, False),
]


def dtype_of(name: str) -> str:
    return "bfloat16" if name.endswith("_bf16_bf16") else "float16"


async def tc_product(
    gpu: gpud_client.Client, name: str, case: tuple[object, ...], rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool, np.ndarray | None]:
    """Kernel `name` dispatched directly (not through the op's tile choice) into a poisoned output."""
    batch, m, n, k, wt, bias_dtype, batched = case
    assert isinstance(batch, int) and isinstance(m, int) and isinstance(n, int) and isinstance(k, int)
    dtype = dtype_of(name)
    x = rand_of(rng, (batch, m, k), dtype)
    shape = (n, k) if wt else (k, n)
    w = rand_of(rng, (batch, *shape) if batched else shape, dtype)
    bias = None if bias_dtype is None else rand_of(rng, (n,), str(bias_dtype), 4.0)
    p = plan(x.shape, w.shape, bool(wt))
    out = upload(gpu, np.full(p.out_shape, np.nan, np.float32), dtype)
    tx, tw = upload(gpu, x, dtype), upload(gpu, w, dtype)
    tb = tx if bias is None else upload(gpu, bias, str(bias_dtype))
    epilogue = 0 if bias is None else BIAS_KINDS[str(bias_dtype)]
    gpu.ops._run(name, tc_grid(name, p.batch, p.m, p.n), [tx, tw, tb, out], [*p.sizes, int(bool(wt)), epilogue], None)
    return await out.numpy(), x, w, bool(wt), bias


def close_of(dtype: str, got: np.ndarray, x: np.ndarray, w: np.ndarray, wt: bool, bias: np.ndarray | None) -> None:
    if dtype == "bfloat16":
        check(got, x, w, wt, "bfloat16", None if bias is None else bias.astype(np.float32))
    else:
        close(got, x, w, wt, bias)


@pytest.mark.parametrize("name", list(TC_KERNELS))
async def test_every_tile_at_edges(gpu: gpud_client.Client, name: str) -> None:
    rng = np.random.default_rng()
    if gpu.backend != "cuda":  # no WebGPU version of the family: the registration is refused, then on
        dtype = dtype_of(name)
        tx, tw = upload(gpu, rand_of(rng, (20, 16), dtype), dtype), upload(gpu, rand_of(rng, (16, 8), dtype), dtype)
        out = gpu.empty((20, 8), dtype)
        gpu.ops._run(name, tc_grid(name, 1, 20, 8), [tx, tw, tx, out], [1, 20, 8, 16, 0, 0, 0, 0], None)
        errors = []
        for _ in range(2):  # the refused registration, and the dispatch of the kernel it did not make
            try:
                await out.numpy()
            except gpud_client.GpudError as exc:
                errors.append(str(exc))
        assert any("matmul_tc kernels have no webgpu version" in e for e in errors), errors
        np.testing.assert_array_equal(await out.numpy(), np.zeros((20, 8)))
        return
    for case in EDGES:
        got, x, w, wt, bias = await tc_product(gpu, name, case, rng)
        close_of(dtype_of(name), got, x, w, wt, bias)
    b, m, n, k = 3, 11, 37, 24  # a shared w with the batches as the grid's z (x_stride M*K, w_stride 0)
    dtype = dtype_of(name)
    x, w = rand_of(rng, (b, m, k), dtype), rand_of(rng, (n, k), dtype)
    tx, out = upload(gpu, x, dtype), upload(gpu, np.full((b, m, n), np.nan, np.float32), dtype)
    gpu.ops._run(name, tc_grid(name, b, m, n), [tx, upload(gpu, w, dtype), tx, out], [b, m, n, k, m * k, 0, 1, 0], None)
    close_of(dtype, await out.numpy(), x, w, True, None)


WIDE = [  # one row of tiles over many columns (the gemm sweep found matmul_tc128x128 wrong at 64 and 128 rows)
    (1, 64, 4864, 896, True, None, False),
    (1, 128, 4864, 896, True, "float16", False),
    (1, 16, 4864, 896, True, None, False),
    (1, 100, 2560, 384, True, None, False),
]


@pytest.mark.parametrize("name", [name for name in TC_KERNELS if name.endswith("_f16_f16")])
async def test_every_tile_over_a_wide_weight(gpu: gpud_client.Client, name: str) -> None:
    if gpu.backend != "cuda":
        pytest.skip("the matmul_tc kernels run on CUDA")
    rng = np.random.default_rng()
    for case in WIDE:
        got, x, w, wt, bias = await tc_product(gpu, name, case, rng)
        close_of(dtype_of(name), got, x, w, wt, bias)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
async def test_long_k_and_the_decoders_prefill(gpu: gpud_client.Client, dtype: str) -> None:
    """Through the op: a Linear's (N, K) weight at prefill sizes, a bias of its dtype, and K = 70,000."""
    rng = np.random.default_rng()
    cases = [(m, n, k) for n, k in DECODE for m in (64, 300)] + [(9, 3, 70_000), (40, 5, 70_000)]
    if gpu.backend != "cuda":
        cases = cases[:1]  # the float32 tiles on lavapipe: one is enough here (test_matmul.py has the rest)
    for m, n, k in cases:
        x, w, bias = rand_of(rng, (m, k), dtype), rand_of(rng, (n, k), dtype), rand_of(rng, (n,), dtype)
        out = upload(gpu, np.full((m, n), np.nan, np.float32), dtype)
        tx, tw, tb = (upload(gpu, a, dtype) for a in (x, w, bias))
        gpu.ops.matmul(tx, tw, transpose_w=True, bias=tb, out=out)
        close_of(dtype, await out.numpy(), x, w, True, bias)
    if gpu.backend == "cuda":
        short = {"float16": "_f16_f16", "bfloat16": "_bf16_bf16"}[dtype]
        assert any(name.startswith("matmul_tc") and name.endswith(short) for name in gpu.ops._kernels)


async def test_a_tensor_core_product_in_a_replay_graph(gpu: gpud_client.Client) -> None:
    rng = np.random.default_rng()
    w = rand(rng, (48, 40), "float16")
    g = gpu.graph("linear-f16")
    x = g.input("x", (24, 40), "float16")
    g.output("y", gpu.ops.matmul(x, gpu.tensor(w), transpose_w=True, graph=g))
    step = await g.build()
    for _ in range(2):
        a = rand(rng, (24, 40), "float16")
        close((await step.replay(x=a))["y"], a, w, True)


async def test_the_daemon_checks_tensor_core_dispatches(gpu: gpud_client.Client) -> None:
    if gpu.backend != "cuda":
        pytest.skip("the tensor-core kernels are CUDA's")
    x32, w16 = gpu.tensor(np.ones((20, 16), np.float32)), gpu.tensor(np.ones((8, 16), np.float16))
    name = "matmul_tc16x32_f16_f16"
    gpu.dispatch(
        gpu.ops._kernel(name), (1, 1, 1), [x32, w16, x32, gpu.empty((20, 8)), *map(u32, [1, 20, 8, 16, 0, 0, 1, 0])]
    )
    with pytest.raises(InvalidArgument, match="takes x float16") as info:
        await gpu.empty((1,)).numpy()
    assert "matmul" in str(info.value)


def test_tile_choice_and_grids() -> None:
    """Narrow tiles for few rows, large ones for many; one block per tile, folded into y past 65,535."""
    assert TC_TILES[tc_kernel(16, 896, 896)].bm == 16
    assert TC_TILES[tc_kernel(4096, 151936, 896)].bm >= 128
    for name, (bm, bn, threads) in TC_KERNELS.items():
        short = "bf16" if name.endswith("_bf16_bf16") else "f16"
        assert KERNELS[name].block == threads and name == f"matmul_tc{bm}x{bn}_{short}_{short}"
        assert tc_grid(name, 3, bm, bn) == (1, 1, 3)
        tiles = -(-4096 // bm) * -(-151936 // bn)
        gx, gy, gz = tc_grid(name, 1, 4096, 151936)
        assert gz == 1 and gx <= MAX_GROUPS and gx * gy >= tiles and gx * (gy - 1) < tiles
    for m in (9, 16, 33, 64, 256, 1024, 4096, 100_000):
        for n in (1, 128, 896, 4864, 151936):
            assert TC_TILES[tc_kernel(m, n, 896)].bm <= max(m, 16)  # never a tile of more rows than x has
            assert tc_kernel(m, n, 896, "bfloat16") == tc_name(tc_kernel(m, n, 896), "bfloat16")  # the same tile


def test_the_rule_of_the_tensor_core_kernels() -> None:
    check = KERNELS["matmul_tc64x64_f16_f16"].check
    x, w, out = TensorInfo("float16", (3, 4, 5)), TensorInfo("float16", (6, 5)), TensorInfo("float16", (3, 4, 6))
    check([x, w, x, out], [1, 12, 6, 5, 0, 0, 1, 0])
    with pytest.raises(OpError, match="takes x float16"):
        check([TensorInfo("float32", (3, 4, 5)), w, x, TensorInfo("float32", (3, 4, 6))], [1, 12, 6, 5, 0, 0, 1, 0])
    with pytest.raises(OpError, match="out is"):
        check([x, w, x, TensorInfo("float32", (3, 4, 6))], [1, 12, 6, 5, 0, 0, 1, 0])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
async def test_two_to_eight_rows_go_to_the_tensor_cores_on_cuda(gpu: gpud_client.Client, dtype: str) -> None:
    """One row stays on matvec (a weight read once at the copy engine's speed); from 2 rows 16-bit
    products go to matmul_tc's 16 x 16 tiles, at cuBLAS's speed where matvec was at half of it."""
    rng = np.random.default_rng()
    w = rand_of(rng, (40, 24), dtype)
    tw = upload(gpu, w, dtype)
    for m in (1, 2, 5, 8):
        x = rand_of(rng, (m, 24), dtype)
        before = set(gpu.ops._kernels)
        got = await gpu.ops.matmul(upload(gpu, x, dtype), tw, transpose_w=True).numpy()
        close_of(dtype, got, x, w, True, None)
        new = set(gpu.ops._kernels) - before
        if gpu.backend == "cuda" and m > 1:
            assert not new or all(name.startswith("matmul_tc16x16") for name in new), new
    if gpu.backend == "cuda":
        assert tc_name("matmul_tc16x16_f16_f16", dtype) in gpu.ops._kernels

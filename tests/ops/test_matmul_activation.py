"""matmul's activation (`gpu.ops.matmul(..., activation=...)`): the bits of the product followed by its
unary op on every backend and kernel, in one launch where the warpgroup kernels (matmul_wg, matmul_tma:
Hopper) apply it as they store their tiles, else as a second launch; the rule each kernel's dispatch is
checked by, without a GPU."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

import gpud_client
from gpud_client.errors import InvalidArgument
from gpud_protocol.ops import KERNELS, OpError, TensorInfo
from gpud_protocol.ops.matmul import ACTIVATIONS
from gpud_protocol.ops.matmul_tma import TMA_TILES, tma_grid, tma_kernel
from gpud_protocol.ops.matmul_wg import wg_kernel
from ops.test_matmul_bf16 import rand, upload
from ops.test_matmul_tc import dtype_of
from ops.test_matmul_tma import assert_activations_are_unary, direct_product, hopper

ERF = np.vectorize(math.erf)
REFERENCE: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "gelu": lambda v: 0.5 * v * (1.0 + ERF(v / math.sqrt(2.0))),
    "gelu_tanh": lambda v: 0.5 * v * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v**3))),
    "silu": lambda v: v / (1.0 + np.exp(-v)),
}
# (M, N, K, dtype): matvec, the tiled kernel, matmul_tc, and on Hopper matmul_wg and matmul_tma
SMALL = [(3, 40, 64, "float32"), (37, 72, 48, "float32"), (3, 40, 64, "float16"), (70, 66, 48, "bfloat16")]
LARGE = [(1000, 384, 1536, "float16"), (2048, 1536, 384, "float16"), (2048, 1536, 384, "bfloat16")]
TOLERANCE = {"float32": 1e-4, "float16": 4e-3, "bfloat16": 3e-2}  # relative to the product's scale


def bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a).tobytes()


async def one(gpu: gpud_client.Client, case: tuple[int, int, int, str], activation: str) -> None:
    m, n, k, dtype = case
    rng = np.random.default_rng([m, n, k, len(activation)])
    x, w, bias = rand(rng, (m, k), dtype), rand(rng, (n, k), dtype), rand(rng, (n,), dtype)
    tx, tw, tb = upload(gpu, x, dtype), upload(gpu, w, dtype), upload(gpu, bias, dtype)
    out = upload(gpu, np.full((m, n), np.nan, np.float32), dtype)  # poisoned: every element written
    gpu.ops.matmul(tx, tw, transpose_w=True, bias=tb, activation=activation, out=out)
    fused = await out.numpy()
    product = gpu.ops.matmul(tx, tw, transpose_w=True, bias=tb)
    unary = (
        gpu.ops.silu(product)
        if activation == "silu"
        else gpu.ops.gelu(product, approximate="tanh" if activation == "gelu_tanh" else "none")
    )
    assert bits(fused) == bits(await unary.numpy()), f"{case} {activation}: not the product's unary op, bit for bit"
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    want = REFERENCE[activation](x64 @ w64.T + bias.astype(np.float64))
    scale = np.abs(x64) @ np.abs(w64).T + np.abs(bias.astype(np.float64)) + 1.0
    assert np.all(np.abs(fused - want) <= TOLERANCE[dtype] * scale), f"{case} {activation}"


@pytest.mark.parametrize("activation", list(ACTIVATIONS))
async def test_the_product_then_its_activation(gpu: gpud_client.Client, activation: str) -> None:
    for case in SMALL:
        await one(gpu, case, activation)
    if gpu.backend == "cuda":  # products too large for lavapipe's seconds
        for case in LARGE:
            await one(gpu, case, activation)


async def test_hopper_applies_it_in_the_warpgroup_kernels(gpu: gpud_client.Client) -> None:
    """One launch: the op's plan carries the activation to matmul_wg and matmul_tma, eager and replayed."""
    if not hopper(gpu):
        pytest.skip("the warpgroup kernels run on compute capability 9.0")
    assert wg_kernel(1000, 384, 1536, "float16") is not None and tma_kernel(1, 2048, 1536, 384, "float16") is not None
    rng = np.random.default_rng(5)
    x, w = rand(rng, (2048, 384), "float16"), rand(rng, (1536, 384), "float16")
    tw = upload(gpu, w, "float16")
    plan = gpu.ops._matmul_plan(upload(gpu, x, "float16"), tw, True, None, None, "gelu")
    assert plan.launch is not None and plan.launch.name.startswith("matmul_tma")
    assert int(plan.launch.scalars[-1].value) == ACTIVATIONS["gelu"] << 8
    eager = await gpu.ops.matmul(upload(gpu, x, "float16"), tw, transpose_w=True, activation="gelu").numpy()
    g = gpu.graph("activation")
    v = g.input("x", x.shape, "float16")
    g.output("y", gpu.ops.matmul(v, tw, transpose_w=True, activation="gelu", graph=g))
    step = await g.build()
    assert bits(np.asarray((await step.replay(x=x))["y"])) == bits(eager)


@pytest.mark.parametrize("name", list(TMA_TILES))
async def test_every_tma_tile_applies_it(gpu: gpud_client.Client, name: str) -> None:
    """Each matmul_tma kernel dispatched directly (the op picks only some): its activated out is, bit for
    bit, its plain out through the unary op, over blocks of one and of two tiles (ping-pong: both
    consumers' epilogues)."""
    if not hopper(gpu):
        pytest.skip("the TMA kernels run on compute capability 9.0")
    dtype, case = dtype_of(name), (1, 1500, 1700, 200, "float32", False, False)  # 168 tiles
    plain, (x, w, bias) = await direct_product(gpu, name, case, np.random.default_rng(7), tma_grid)
    for activation, fused in (await assert_activations_are_unary(gpu, name, case, 7, plain, dtype)).items():
        x64, w64, b64 = x[0].astype(np.float64), w.astype(np.float64), bias.astype(np.float64)
        want = REFERENCE[activation](x64 @ w64.T + b64)
        scale = np.abs(x64) @ np.abs(w64).T + np.abs(b64) + 1.0
        assert np.all(np.abs(fused[0] - want) <= TOLERANCE[dtype] * scale), f"{name} {activation}"


async def test_an_unknown_activation_is_refused_by_name(gpu: gpud_client.Client) -> None:
    x = gpu.tensor(np.ones((2, 4), np.float32))
    with pytest.raises(InvalidArgument, match="activation is None or one of") as info:
        gpu.ops.matmul(x, x, transpose_w=True, activation="relu6")
    assert info.value.op == "matmul"


def test_only_the_warpgroup_kernels_take_an_activation() -> None:
    x, w, out = TensorInfo("float16", (300, 64)), TensorInfo("float16", (96, 64)), TensorInfo("float16", (300, 96))
    bias = TensorInfo("float16", (96,))
    scalars = [1, 300, 96, 64, 0, 0, 1]
    for code in ACTIVATIONS.values():
        for name in ("matmul_tma128x128_f16_f16", "matmul_wg64x64_f16_f16"):
            KERNELS[name].check([x, w, bias, out], [*scalars, code << 8 | 2])
        for name in ("matmul_f16_f16", "matvec_f16_f16", "matmul_tc16x16_f16_f16"):
            rows = [1, 8, 96, 64, 0, 0, 1] if name.startswith("matvec") else scalars
            tensors = (
                [x, w, bias, out]
                if rows is scalars
                else [x._replace(shape=(8, 64)), w, bias, out._replace(shape=(8, 96))]
            )
            with pytest.raises(OpError, match=f"{name} applies no activation"):
                KERNELS[name].check(tensors, [*rows, code << 8 | 2])
    with pytest.raises(OpError, match="activation is 0 or one of"):
        KERNELS["matmul_tma128x128_f16_f16"].check([x, w, bias, out], [*scalars, 6 << 8])
    with pytest.raises(OpError, match="bias kind 3 is a bfloat16 bias"):
        KERNELS["matmul_wg64x64_f16_f16"].check([x, w, bias, out], [*scalars, 4 << 8 | 3])

"""matmul_nk, the products lavapipe runs for w as (N, K) and K a multiple of 8, against numpy in float64:
every (x, w) dtype pair, sizes off the thread's 12 x 12 block and the workgroup's 96 x 96 tile, biases
of every float dtype, batches (batched w, shared w folded into the rows or on the grid's z, a 2-D x
against batched w), K at lavapipe's loop limit (K / 8 = 65,535 iterations), poisoned outputs, a replay
graph, the rule (client and daemon), and which kernel the client picks. Also the tiled kernel on the
products the client now sends to matmul_nk on lavapipe (w as (N, K)), dispatched directly, so that it
stays checked where GPUs run it. Tolerances as tests/ops/test_matmul.py (float32 accumulation: 1e-5 of
the row's magnitude; a float16 out two ulps more; a bfloat16 out between the roundings of the bounds).
"""

from __future__ import annotations

import numpy as np
import pytest

import gpud_client
from gpud_client import InvalidArgument, u32
from gpud_protocol.ops import KERNELS, OpError, TensorInfo
from gpud_protocol.ops.matmul import PAIRS, SHORT, matmul_grid
from gpud_protocol.ops.matmul_nk import NK_STEP, nk_applies, nk_grid
from ops.test_bfloat16 import bf
from ops.test_matmul import ACC_TOL, reference

# (M, N, K): one row and column; inside a block; past a block; past a tile (96) on both sides; K one step
SIZES = [(9, 1, 8), (12, 12, 16), (13, 25, 24), (97, 95, 40), (200, 193, 8)]
NAMES = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}


def rand(rng: np.random.Generator, shape: tuple[int, ...], dtype: str, scale: float = 1.0) -> np.ndarray:
    """Values of `dtype`: float16 as float16, bfloat16's (already rounded) as float32."""
    a = rng.standard_normal(shape) * scale
    return bf(a) if dtype == "bfloat16" else a.astype(dtype)


def upload(gpu: gpud_client.Client, a: np.ndarray, dtype: str) -> gpud_client.Tensor:
    return gpu.tensor(a, dtype="bfloat16") if dtype == "bfloat16" else gpu.tensor(np.asarray(a, dtype))


def result_dtype(x_dtype: str, w_dtype: str) -> str:
    return x_dtype if x_dtype == w_dtype else "float32"


def check(got: np.ndarray, x: np.ndarray, w: np.ndarray, out: str, bias: np.ndarray | None = None) -> None:
    ref, scale = reference(x, w, True, bias)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    got64 = got.astype(np.float64)
    assert not np.isnan(got64).any(), "NaN (an unwritten or poisoned element)"
    slack = ACC_TOL * scale
    if out == "bfloat16":
        bad = (got64 < bf(ref - slack)) | (got64 > bf(ref + slack))
        assert not bad.any(), f"{bad.sum()} outside their roundings, e.g. {got64[bad][:3]} for {ref[bad][:3]}"
        return
    bound = slack + (2e-3 * np.abs(ref) if out == "float16" else 0.0)
    assert np.all(np.abs(got64 - ref) <= bound), np.max(np.abs(got64 - ref) / bound)


async def product(
    gpu: gpud_client.Client,
    x: np.ndarray,
    w: np.ndarray,
    dtypes: tuple[str, str],
    bias: tuple[np.ndarray, str] | None = None,
) -> np.ndarray:
    """x @ w.T (+ bias) through gpu.ops.matmul into a poisoned output, read back."""
    out = upload(gpu, np.full(reference(x, w, True)[0].shape, np.nan, np.float32), result_dtype(*dtypes))
    b = None if bias is None else upload(gpu, *bias)
    got = gpu.ops.matmul(upload(gpu, x, dtypes[0]), upload(gpu, w, dtypes[1]), transpose_w=True, bias=b, out=out)
    assert got is out
    result: np.ndarray = await out.numpy()
    return result


def software(gpu: gpud_client.Client) -> bool:
    return gpu.backend == "webgpu" and bool(gpu.devices[gpu.device].get("software"))


@pytest.mark.parametrize(("x_dtype", "w_dtype"), PAIRS)
async def test_every_pair_at_sizes_off_the_block_and_tile(gpu: gpud_client.Client, x_dtype: str, w_dtype: str) -> None:
    rng = np.random.default_rng()
    for m, n, k in SIZES:
        x, w = rand(rng, (m, k), x_dtype), rand(rng, (n, k), w_dtype)
        check(await product(gpu, x, w, (x_dtype, w_dtype)), x, w, result_dtype(x_dtype, w_dtype))
    x, w = rand(rng, (124, 384), x_dtype), rand(rng, (1152, 384), w_dtype)  # a MiniLM layer over 2 sequences
    bias = rand(rng, (1152,), w_dtype)
    check(await product(gpu, x, w, (x_dtype, w_dtype), (bias, w_dtype)), x, w, result_dtype(x_dtype, w_dtype), bias)
    used = set(gpu.ops._kernels)
    name = f"matmul_nk_{NAMES[x_dtype]}_{NAMES[w_dtype]}"
    assert (name in used) == software(gpu), used


@pytest.mark.parametrize("bias_dtype", ["float32", "float16", "bfloat16"])
async def test_biases_of_every_float_dtype(gpu: gpud_client.Client, bias_dtype: str) -> None:
    rng = np.random.default_rng()
    for x_dtype, w_dtype in PAIRS:
        x, w = rand(rng, (23, 48), x_dtype), rand(rng, (29, 48), w_dtype)
        bias = rand(rng, (29,), bias_dtype, 10.0)
        got = await product(gpu, x, w, (x_dtype, w_dtype), (bias, bias_dtype))
        check(got, x, w, result_dtype(x_dtype, w_dtype), bias)


async def test_batches_with_batched_or_shared_weights(gpu: gpud_client.Client) -> None:
    rng = np.random.default_rng()
    b, m, n, k = 3, 20, 33, 64
    for x_dtype, w_dtype in PAIRS:
        out = result_dtype(x_dtype, w_dtype)
        x = rand(rng, (b, m, k), x_dtype)
        batched, shared = rand(rng, (b, n, k), w_dtype), rand(rng, (n, k), w_dtype)
        check(await product(gpu, x, batched, (x_dtype, w_dtype)), x, batched, out)
        check(await product(gpu, x, shared, (x_dtype, w_dtype)), x, shared, out)  # folded: B * M rows
        x2 = rand(rng, (m, k), x_dtype)
        check(await product(gpu, x2, batched, (x_dtype, w_dtype)), x2, batched, out)


async def test_shared_weights_unfolded(gpu: gpud_client.Client) -> None:
    """A shared w with the batches on the grid's z (x_stride M*K, w_stride 0), as the daemon allows."""
    if gpu.backend != "webgpu":
        pytest.skip("matmul_nk is WebGPU's")
    rng = np.random.default_rng()
    b, m, n, k = 3, 17, 37, 24
    x, w = rand(rng, (b, m, k), "float32"), rand(rng, (n, k), "float16")
    tx, tw = gpu.tensor(x), gpu.tensor(w)
    out = gpu.tensor(np.full((b, m, n), np.nan, np.float32))
    gpu.ops._run("matmul_nk_f32_f16", nk_grid(b, m, n), [tx, tw, tx, out], [b, m, n, k, m * k, 0, 1, 0], None)
    check(await out.numpy(), x, w, "float32")


async def test_k_at_lavapipes_loop_limit(gpu: gpud_client.Client) -> None:
    """K / 8 = 65,535 iterations of the K loop: every one must count (lavapipe stops a loop past that)."""
    rng = np.random.default_rng()
    k = NK_STEP * 65_535
    assert nk_applies(k, True) and not nk_applies(k + NK_STEP, True)
    x, w = rand(rng, (13, k), "float16"), rand(rng, (3, k), "float16")
    x[:, -NK_STEP:] = 0  # the last step decides the sign of the result: a loop cut short leaves the other
    x[:, -1] = 1e3
    w[:, -1] = np.array([1, -1, 1], np.float16) * 30
    check(await product(gpu, x, w, ("float16", "float16")), x, w, "float16")


async def test_a_linear_layer_in_a_replay_graph(gpu: gpud_client.Client) -> None:
    rng = np.random.default_rng()
    w, bias = rand(rng, (40, 32), "float16"), rand(rng, (40,), "float16")
    tw, tb = gpu.tensor(w), gpu.tensor(bias)
    g = gpu.graph("nk-linear")
    x = g.input("x", (2, 9, 32), "float16")
    g.output("y", gpu.ops.matmul(x, tw, transpose_w=True, bias=tb, graph=g))
    step = await g.build()
    for _ in range(2):
        a = rand(rng, (2, 9, 32), "float16")
        check((await step.replay(x=a))["y"], a, w, "float16", bias)


@pytest.mark.parametrize(
    ("x_dtype", "w_dtype"), [("float32", "float16"), ("float16", "float16"), ("bfloat16", "bfloat16")]
)
async def test_the_tiled_kernel_on_what_lavapipe_sends_to_matmul_nk(
    gpu: gpud_client.Client, x_dtype: str, w_dtype: str
) -> None:
    """Whole 64 x 64 tiles and a MiniLM layer, w as (N, K), through matmul_<x>_<w> dispatched directly."""
    if gpu.backend != "webgpu":
        pytest.skip("on CUDA the client picks the tensor cores; matmul_<x>_<w> is tested in test_matmul.py")
    rng = np.random.default_rng()
    name = f"matmul_{SHORT[x_dtype]}_{SHORT[w_dtype]}"
    for m, n, k in [(64, 64, 64), (128, 192, 48), (124, 1152, 384)]:
        x, w = rand(rng, (m, k), x_dtype), rand(rng, (n, k), w_dtype)
        tx = upload(gpu, x, x_dtype)
        out = upload(gpu, np.full((m, n), np.nan, np.float32), result_dtype(x_dtype, w_dtype))
        gpu.ops._run(name, matmul_grid(1, m, n), [tx, upload(gpu, w, w_dtype), tx, out], [1, m, n, k, 0, 0, 1, 0], None)
        check(await out.numpy(), x, w, result_dtype(x_dtype, w_dtype))


async def test_the_daemon_refuses_what_matmul_nk_does_not_take(gpu: gpud_client.Client) -> None:
    """A client that skips the library's choice: K not a multiple of 8, or w as (K, N), is a typed error."""
    if gpu.backend != "webgpu":
        pytest.skip("matmul_nk is WebGPU's")
    f32 = np.float32
    kernel = gpu.ops._kernel("matmul_nk_f32_f32")
    x, w, out = gpu.tensor(np.ones((9, 12), f32)), gpu.tensor(np.ones((3, 12), f32)), gpu.empty((9, 3))
    gpu.dispatch(kernel, (1, 1, 1), [x, w, x, out, *map(u32, [1, 9, 3, 12, 0, 0, 1, 0])])
    with pytest.raises(InvalidArgument, match="multiple of 8") as info:
        await out.numpy()
    assert "matmul" in str(info.value)
    x, w, out = gpu.tensor(np.ones((9, 16), f32)), gpu.tensor(np.ones((16, 3), f32)), gpu.empty((9, 3))
    gpu.dispatch(kernel, (1, 1, 1), [x, w, x, out, *map(u32, [1, 9, 3, 16, 0, 0, 0, 0])])
    with pytest.raises(InvalidArgument, match="wt 1"):
        await out.numpy()
    w = gpu.tensor(np.ones((3, 16), f32))  # the session goes on
    gpu.dispatch(kernel, nk_grid(1, 9, 3), [x, w, x, out, *map(u32, [1, 9, 3, 16, 0, 0, 1, 0])])
    np.testing.assert_array_equal(await out.numpy(), np.full((9, 3), 16, f32))


def test_the_rule_and_the_choice() -> None:
    check_nk = KERNELS["matmul_nk_f32_f16"].check
    x, w, out = TensorInfo("float32", (3, 4, 16)), TensorInfo("float16", (6, 16)), TensorInfo("float32", (3, 4, 6))
    bias = TensorInfo("bfloat16", (6,))
    check_nk([x, w, bias, out], [1, 12, 6, 16, 0, 0, 1, 3])  # folded
    check_nk([x, w, bias, out], [3, 4, 6, 16, 64, 0, 1, 3])  # unfolded
    with pytest.raises(OpError, match="K="):  # w read as (K, N): the tiled rule's own refusal
        check_nk([x, w, bias, out], [1, 12, 6, 16, 0, 0, 0, 3])
    x12, w12 = TensorInfo("float32", (4, 12)), TensorInfo("float16", (6, 12))
    with pytest.raises(OpError, match="multiple of 8"):
        check_nk([x12, w12, bias, TensorInfo("float32", (4, 6))], [1, 4, 6, 12, 0, 0, 1, 0])
    with pytest.raises(OpError, match="takes x float32"):
        check_nk([w, w, bias, out], [1, 12, 6, 16, 0, 0, 1, 0])
    assert {name for name in KERNELS if name.startswith("matmul_nk_")} == {
        f"matmul_nk_{SHORT[a]}_{SHORT[b]}" for a, b in PAIRS
    }
    assert nk_applies(384, True) and not nk_applies(384, False) and not nk_applies(100, True)
    assert nk_grid(2, 960, 1536) == (16, 10, 2) and nk_grid(1, 1, 1) == (1, 1, 1)
    with pytest.raises(OpError, match="workgroups"):
        nk_grid(1, 96 * 65_536, 8)

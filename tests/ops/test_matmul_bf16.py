"""bfloat16 matrix products against numpy in float64, on every backend: bfloat16 x bfloat16 (out
bfloat16), bfloat16 with float32 (out float32), both kernels (matvec up to 8 rows, the tiled matmul
past them; on CUDA the tensor cores for bfloat16 x and w past 8 rows: test_matmul_tc.py dispatches every
tile directly), both layouts of w, sizes off the workgroup, K past lavapipe's loop limit, batches,
biases of every float dtype, poisoned outputs; float16 with bfloat16 refused by name (client and
daemon); nn.Linear on a bfloat16 checkpoint's weights; a replay graph.

Tolerances. bfloat16 inputs are exact in float64, so a float32 output errs by float32 accumulation
only (1e-5 of the row's magnitude S = |x| @ |w| + |bias|, as test_matmul.py). A bfloat16 output is
that float32 result rounded once to nearest even: it must lie between the roundings of ref - 1e-5 S
and ref + 1e-5 S (rounding is monotonic), which a truncating or twice-rounding kernel fails.
"""

from __future__ import annotations

import numpy as np
import pytest

import gpud_client
from gpud_client import InvalidArgument, nn, u32
from gpud_protocol.ops import KERNELS, OpError, TensorInfo
from ops.test_bfloat16 import bf
from ops.test_matmul import ACC_TOL, LONG_K, SIZES, reference

PAIRS = [("bfloat16", "bfloat16"), ("float32", "bfloat16"), ("bfloat16", "float32")]
SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}


def rand(rng: np.random.Generator, shape: tuple[int, ...], dtype: str, scale: float = 1.0) -> np.ndarray:
    """Values of `dtype` as a float32 array (bfloat16's, already rounded), or float16's as float16."""
    a = rng.standard_normal(shape) * scale
    return bf(a) if dtype == "bfloat16" else a.astype(dtype)


def upload(gpu: gpud_client.Client, a: np.ndarray, dtype: str) -> gpud_client.Tensor:
    return gpu.tensor(a, dtype="bfloat16") if dtype == "bfloat16" else gpu.tensor(a.astype(dtype))


def result_dtype(x_dtype: str, w_dtype: str) -> str:
    return x_dtype if x_dtype == w_dtype else "float32"


def check(got: np.ndarray, x: np.ndarray, w: np.ndarray, wt: bool, out: str, bias: np.ndarray | None = None) -> None:
    ref, scale = reference(x, w, wt, bias)
    assert got.shape == ref.shape and got.dtype == np.float32, (got.shape, got.dtype)
    got64 = got.astype(np.float64)
    assert not np.isnan(got64).any(), "NaN (an unwritten or poisoned element)"
    slack = ACC_TOL * scale
    if out == "bfloat16":
        low, high = bf(ref - slack).astype(np.float64), bf(ref + slack).astype(np.float64)
        bad = (got64 < low) | (got64 > high)
        assert not bad.any(), f"{bad.sum()} outside their roundings, e.g. {got64[bad][:3]} for {ref[bad][:3]}"
    else:
        assert np.all(np.abs(got64 - ref) <= slack), np.max(np.abs(got64 - ref) / slack)


async def product(
    gpu: gpud_client.Client,
    x: np.ndarray,
    w: np.ndarray,
    dtypes: tuple[str, str],
    wt: bool,
    bias: tuple[np.ndarray, str] | None = None,
) -> np.ndarray:
    """The op into a poisoned output, read back (float32 values for a bfloat16 output)."""
    out_dtype = result_dtype(*dtypes)
    shape = reference(x, w, wt)[0].shape
    out = upload(gpu, np.full(shape, np.nan, np.float32), out_dtype)
    b = None if bias is None else upload(gpu, *bias)
    got = gpu.ops.matmul(upload(gpu, x, dtypes[0]), upload(gpu, w, dtypes[1]), transpose_w=wt, bias=b, out=out)
    assert got is out
    result: np.ndarray = await out.numpy()
    return result


@pytest.mark.parametrize("wt", [False, True], ids=["kn", "nk"])
@pytest.mark.parametrize(("x_dtype", "w_dtype"), PAIRS)
async def test_every_bfloat16_pair_at_sizes_off_the_workgroup(
    gpu: gpud_client.Client, x_dtype: str, w_dtype: str, wt: bool
) -> None:
    rng = np.random.default_rng()
    out = result_dtype(x_dtype, w_dtype)
    for m, n, k in [*SIZES, (64, 64, 64), (130, 192, 48)]:  # and whole tiles: whole words of a bfloat16 out
        x, w = rand(rng, (m, k), x_dtype), rand(rng, (n, k) if wt else (k, n), w_dtype)
        check(await product(gpu, x, w, (x_dtype, w_dtype), wt), x, w, wt, out)
    used = set(gpu.ops._kernels)
    assert f"matvec_{SHORT[x_dtype]}_{SHORT[w_dtype]}" in used
    if gpu.backend == "cuda" and x_dtype == w_dtype:
        assert any(name.startswith("matmul_tc") and name.endswith("_bf16_bf16") for name in used), used
    else:
        assert f"matmul_{SHORT[x_dtype]}_{SHORT[w_dtype]}" in used


@pytest.mark.parametrize("bias_dtype", ["float32", "float16", "bfloat16"])
async def test_biases_of_every_float_dtype(gpu: gpud_client.Client, bias_dtype: str) -> None:
    rng = np.random.default_rng()
    pairs = [*PAIRS, ("float16", "float16"), ("float32", "float32")]
    sizes = [(1, 257, 33), (7, 65, 7), (33, 70, 65), (65, 7, 257), (9, 5, 3)]
    for (x_dtype, w_dtype), (m, n, k) in zip(pairs, sizes, strict=True):
        for wt in (False, True):
            x, w = rand(rng, (m, k), x_dtype), rand(rng, (n, k) if wt else (k, n), w_dtype)
            bias = rand(rng, (n,), bias_dtype, 10.0)
            got = await product(gpu, x, w, (x_dtype, w_dtype), wt, (bias, bias_dtype))
            out = result_dtype(x_dtype, w_dtype)
            if out == "float16":
                ref, scale = reference(x, w, wt, bias)
                assert np.all(np.abs(got - ref) <= ACC_TOL * scale + 2e-3 * np.abs(ref))
            else:
                check(got, x, w, wt, out, bias.astype(np.float32))


@pytest.mark.parametrize("wt", [False, True], ids=["kn", "nk"])
async def test_k_past_lavapipes_loop_limit_and_batches(gpu: gpud_client.Client, wt: bool) -> None:
    rng = np.random.default_rng()
    for m in (1, 9):  # matvec, then the tiled kernel (the tensor cores on CUDA)
        for dtypes in [("bfloat16", "bfloat16"), ("float32", "bfloat16")]:
            x, w = rand(rng, (m, LONG_K), dtypes[0]), rand(rng, (3, LONG_K) if wt else (LONG_K, 3), dtypes[1])
            check(await product(gpu, x, w, dtypes, wt), x, w, wt, result_dtype(*dtypes))
    b, n, k = 3, 33, 65
    for m in (1, 5, 20):
        x = rand(rng, (b, m, k), "bfloat16")
        batched = rand(rng, (b, n, k) if wt else (b, k, n), "bfloat16")
        shared = rand(rng, (n, k) if wt else (k, n), "bfloat16")
        for w in (batched, shared):  # batches on the grid, or folded into B * M rows
            check(await product(gpu, x, w, ("bfloat16", "bfloat16"), wt), x, w, wt, "bfloat16")


async def test_float16_with_bfloat16_is_refused_by_name(gpu: gpud_client.Client) -> None:
    """As torch: no kernel multiplies a float16 by a bfloat16; the error names matmul and says to cast."""
    half = gpu.tensor(np.ones((4, 8), np.float16))
    brain = gpu.tensor(np.ones((8, 8), np.float32), dtype="bfloat16")
    for x, w in [(half, brain), (brain, half)]:
        with pytest.raises(InvalidArgument, match=r"matmul: x is .* cast one to the other's dtype") as info:
            gpu.ops.matmul(x, w)
        assert info.value.op == "matmul"
    with pytest.raises(InvalidArgument, match="Linear: x is float16 and the weight bfloat16") as info:
        nn.Linear(gpu, brain)(half)
    assert info.value.op == "Linear"
    out = gpu.empty((4, 8), "bfloat16")
    gpu.dispatch(  # a client that skips the library's checks: the daemon's rule refuses it too
        gpu.ops._kernel("matmul_bf16_bf16"), (1, 1, 1), [half, brain, half, out, *map(u32, [1, 4, 8, 8, 0, 0, 0, 0])]
    )
    with pytest.raises(InvalidArgument, match="takes x bfloat16 and w bfloat16, got x float16"):
        await out.numpy()
    got = gpu.ops.matmul(gpu.ops.cast(half, "bfloat16"), brain)  # cast, then it runs
    np.testing.assert_array_equal(await got.numpy(), np.full((4, 8), 8, np.float32))


async def test_linear_on_bfloat16_weights(gpu: gpud_client.Client) -> None:
    """A checkpoint's bfloat16 Linear (bias too) on bfloat16 and float32 activations, 2-D and 4-D x."""
    rng = np.random.default_rng()
    w, b = rand(rng, (48, 40), "bfloat16"), rand(rng, (48,), "bfloat16")
    layer = nn.Linear(gpu, gpu.tensor(w, dtype="bfloat16"), gpu.tensor(b, dtype="bfloat16"))
    for shape in [(1, 40), (12, 40), (2, 3, 2, 40)]:
        for dtype in ("bfloat16", "float32"):
            x = rand(rng, shape, dtype)
            y = layer(upload(gpu, x, dtype))
            assert y.shape == (*shape[:-1], 48) and y.dtype == dtype
            rows = x.reshape(-1, 40)
            check((await y.numpy()).reshape(-1, 48), rows, w, True, dtype, b)


async def test_bfloat16_products_in_a_replay_graph(gpu: gpud_client.Client) -> None:
    rng = np.random.default_rng()
    w1, w2 = rand(rng, (40, 24), "bfloat16"), rand(rng, (40, 17), "bfloat16")
    t1, t2 = gpu.tensor(w1, dtype="bfloat16"), gpu.tensor(w2, dtype="bfloat16")
    for tokens in (1, 9):
        g = gpu.graph(f"bf16-linear-{tokens}")
        x = g.input("x", (tokens, 24), "bfloat16")
        h = gpu.ops.matmul(x, t1, transpose_w=True, graph=g)
        g.output("h", h)
        g.output("y", gpu.ops.matmul(h, t2, graph=g))
        step = await g.build()
        a = rand(rng, (tokens, 24), "bfloat16")
        got = await step.replay(x=a)
        check(got["h"], a, w1, True, "bfloat16")
        check(got["y"], got["h"], w2, False, "bfloat16")  # from the h it read back (rounded)
        step.free()


def test_the_rule_of_the_bfloat16_kernels() -> None:
    x, w = TensorInfo("bfloat16", (3, 2, 5)), TensorInfo("bfloat16", (6, 5))
    out, bias = TensorInfo("bfloat16", (3, 2, 6)), TensorInfo("bfloat16", (6,))
    sizes = [1, 6, 6, 5, 0, 0, 1]  # folded: 6 rows, N 6, K 5, w as (N, K)
    for name in ("matvec_bf16_bf16", "matmul_bf16_bf16", "matmul_tc64x64_bf16_bf16"):
        check_rule = KERNELS[name].check
        check_rule([x, w, bias, out], [*sizes, 3])
        with pytest.raises(OpError, match="bias kind 3 is a bfloat16 bias"):
            check_rule([x, w, TensorInfo("float32", (6,)), out], [*sizes, 3])
        with pytest.raises(OpError, match="out is float32"):
            check_rule([x, w, bias, TensorInfo("float32", (3, 2, 6))], [*sizes, 0])
        with pytest.raises(OpError, match="takes x bfloat16"):
            check_rule([TensorInfo("float16", (3, 2, 5)), w, bias, out], [*sizes, 0])
    f32 = TensorInfo("float32", (3, 2, 5))
    KERNELS["matmul_f32_bf16"].check([f32, w, bias, TensorInfo("float32", (3, 2, 6))], [*sizes, 3])
    assert not any({"f16", "bf16"} <= set(name.split("_")) for name in KERNELS if name.startswith("mat"))

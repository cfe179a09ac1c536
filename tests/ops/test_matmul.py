"""Matrix products against numpy in float64, on every backend: fresh random inputs, every mix of
float32 and float16 operands, w as (K, N) and transposed (N, K), sizes that are not multiples of the
workgroup (1, 7, 33, 65, 257), both kernels (matvec for up to 8 rows of x per weight matrix, and up to
32 in equal groups of 4 to 8, each row with the bits it gets alone; the tiled matmul past that),
K = 70,000 (past lavapipe's 65,535 loop iterations had one thread walked K alone), batches (batched or
shared weights), biases, the decoder's shapes, poisoned outputs (NaN never passes), typed errors from
the client and from the daemon, and replay graphs.

Tolerances. The references use the operands as stored (float16 inputs are exact in float64), so the
only errors are float32 accumulation and the rounding of a float16 output:
    |got - ref| <= 1e-5 * S + out_tol * |ref|,   S = |x| @ |w| + |bias| (the row's magnitude scale)
with out_tol 0 for a float32 output and 2e-3 for a float16 one (two float16 ulps: WGSL's f16() may
round to either neighbour). Summing in float32 errs by at most ~K * 6e-8 * S in the worst case and by
~sqrt(K) * 6e-8 * S in practice, far inside 1e-5 * S at these sizes.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import gpud_client
from gpud_client import InvalidArgument, u32
from gpud_protocol.ops import KERNELS, OpError, TensorInfo
from gpud_protocol.ops.matmul import matmul_grid, matvec_grid, matvec_groups, plan

DTYPES = ["float32", "float16"]
MIXES = [(x, w) for x in DTYPES for w in DTYPES]
ACC_TOL = 1e-5
OUT_TOL = {"float32": 0.0, "float16": 2e-3}
# (M, N, K): M <= 8 runs the matvec kernel, M > 8 the tiled one (none of these splits into groups of 4..8)
SIZES = [(1, 1, 1), (1, 7, 257), (2, 257, 33), (8, 33, 7), (9, 33, 257), (33, 7, 65), (65, 129, 16), (257, 70, 33)]
DECODE = [(896, 896), (128, 896), (4864, 896), (896, 4864)]  # (N, K) of a 0.5B decoder's linear layers
LONG_K = 70_000


def rand(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    return rng.standard_normal(shape).astype(dtype)


def poisoned(gpu: gpud_client.Client, shape: tuple[int, ...], dtype: str) -> gpud_client.Tensor:
    """An output filled with NaN: an element the op does not write fails the check."""
    return gpu.tensor(np.full(shape, np.nan, dtype))


def out_dtype(x: np.ndarray, w: np.ndarray) -> str:
    return "float16" if x.dtype == w.dtype == np.float16 else "float32"


def reference(x: np.ndarray, w: np.ndarray, wt: bool, bias: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(x @ w + bias, |x| @ |w| + |bias|) in float64."""
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    if wt:
        w64 = np.swapaxes(w64, -1, -2)
    ref, scale = x64 @ w64, np.abs(x64) @ np.abs(w64)
    if bias is not None:
        ref, scale = ref + bias.astype(np.float64), scale + np.abs(bias.astype(np.float64))
    return ref, scale


def close(got: np.ndarray, x: np.ndarray, w: np.ndarray, wt: bool, bias: np.ndarray | None = None) -> None:
    ref, scale = reference(x, w, wt, bias)
    dtype = out_dtype(x, w)
    assert got.dtype == np.dtype(dtype) and got.shape == ref.shape, (got.dtype, got.shape, ref.shape)
    got64 = got.astype(np.float64)
    assert not np.isnan(got64).any(), "NaN (an unwritten or poisoned element)"
    err = np.abs(got64 - ref)
    bound = ACC_TOL * scale + OUT_TOL[dtype] * np.abs(ref)
    assert np.all(err <= bound), np.max(err / bound)


async def product(
    gpu: gpud_client.Client, x: np.ndarray, w: np.ndarray, wt: bool, bias: np.ndarray | None = None
) -> np.ndarray:
    """The op into a poisoned output, read back."""
    out = poisoned(gpu, reference(x, w, wt)[0].shape, out_dtype(x, w))
    b = None if bias is None else gpu.tensor(bias)
    got = gpu.ops.matmul(gpu.tensor(x), gpu.tensor(w), transpose_w=wt, bias=b, out=out)
    assert got is out
    result: np.ndarray = await out.numpy()
    return result


@pytest.mark.parametrize("wt", [False, True], ids=["kn", "nk"])
@pytest.mark.parametrize(("x_dtype", "w_dtype"), MIXES)
async def test_every_dtype_mix_at_sizes_off_the_workgroup(
    gpu: gpud_client.Client, x_dtype: str, w_dtype: str, wt: bool
) -> None:
    rng = np.random.default_rng()
    for m, n, k in SIZES:
        x = rand(rng, (m, k), x_dtype)
        w = rand(rng, (n, k) if wt else (k, n), w_dtype)
        close(await product(gpu, x, w, wt), x, w, wt)
    short = {"float32": "f32", "float16": "f16"}
    used = {name for name in gpu.ops._kernels}
    assert f"matvec_{short[x_dtype]}_{short[w_dtype]}" in used
    if gpu.backend == "cuda" and x_dtype == w_dtype == "float16":  # past 8 rows: the tensor cores
        assert any(name.startswith("matmul_tc") for name in used), used
    else:
        assert f"matmul_{short[x_dtype]}_{short[w_dtype]}" in used


@pytest.mark.parametrize("wt", [False, True], ids=["kn", "nk"])
@pytest.mark.parametrize(("x_dtype", "w_dtype"), MIXES)
async def test_whole_tiles_and_an_encoder_layer(gpu: gpud_client.Client, x_dtype: str, w_dtype: str, wt: bool) -> None:
    """Products of whole 64 x 64 tiles over several K steps (nothing masked: every thread's block and
    every K-group's share of a step counts), and a MiniLM layer over two 62-token sequences, biased."""
    rng = np.random.default_rng()
    for m, n, k in [(64, 64, 64), (128, 192, 48)]:
        x = rand(rng, (m, k), x_dtype)
        w = rand(rng, (n, k) if wt else (k, n), w_dtype)
        close(await product(gpu, x, w, wt), x, w, wt)
    x = rand(rng, (124, 384), x_dtype)
    w = rand(rng, (1152, 384) if wt else (384, 1152), w_dtype)
    bias = rand(rng, (1152,), w_dtype)
    close(await product(gpu, x, w, wt, bias), x, w, wt, bias)


@pytest.mark.parametrize("x_dtype", DTYPES)
async def test_the_decoders_linear_layers(gpu: gpud_client.Client, x_dtype: str) -> None:
    """x (1, 896) @ w (N, K) float16, transpose_w, as a 0.5B decoder runs them; and 4 sequences at once."""
    rng = np.random.default_rng()
    for n, k in DECODE:
        w = rand(rng, (n, k), "float16")
        for x in (rand(rng, (1, k), x_dtype), rand(rng, (4, 1, k), x_dtype)):
            close(await product(gpu, x, w, True), x, w, True)


@pytest.mark.parametrize("wt", [False, True], ids=["kn", "nk"])
@pytest.mark.parametrize(
    ("x_dtype", "w_dtype"), [("float32", "float16"), ("float16", "float16"), ("float32", "float32")]
)
async def test_k_past_lavapipes_loop_limit(gpu: gpud_client.Client, x_dtype: str, w_dtype: str, wt: bool) -> None:
    rng = np.random.default_rng()
    for m in (1, 9):  # matvec, then the tiled kernel
        x = rand(rng, (m, LONG_K), x_dtype)
        w = rand(rng, (3, LONG_K) if wt else (LONG_K, 3), w_dtype)
        close(await product(gpu, x, w, wt), x, w, wt)


@pytest.mark.parametrize("wt", [False, True], ids=["kn", "nk"])
async def test_batches_with_batched_or_shared_weights(gpu: gpud_client.Client, wt: bool) -> None:
    rng = np.random.default_rng()
    b, n, k = 3, 33, 65
    for m in (1, 5, 20):  # matvec, matvec (m <= 8), tiled
        for x_dtype, w_dtype in MIXES:
            x = rand(rng, (b, m, k), x_dtype)
            batched = rand(rng, (b, n, k) if wt else (b, k, n), w_dtype)
            shared = rand(rng, (n, k) if wt else (k, n), w_dtype)
            close(await product(gpu, x, batched, wt), x, batched, wt)
            close(await product(gpu, x, shared, wt), x, shared, wt)  # folded: B * M rows
            x2 = rand(rng, (m, k), x_dtype)  # a 2-D x against batched weights
            close(await product(gpu, x2, batched, wt), x2, batched, wt)


async def test_attention_like_batched_products(gpu: gpud_client.Client) -> None:
    """scores = q @ k^T per head, then probabilities @ v: (heads, T, d) shapes, float16 caches."""
    rng = np.random.default_rng()
    heads, t, s, d = 4, 7, 33, 64
    for query_len in (1, t):  # decode (matvec per head) and prefill (tiled)
        q = rand(rng, (heads, query_len, d), "float32")
        keys = rand(rng, (heads, s, d), "float16")
        close(await product(gpu, q, keys, True), q, keys, True)
        probs = rng.random((heads, query_len, s)).astype(np.float32)
        values = rand(rng, (heads, s, d), "float16")
        close(await product(gpu, probs, values, False), probs, values, False)


@pytest.mark.parametrize("bias_dtype", DTYPES)
async def test_bias(gpu: gpud_client.Client, bias_dtype: str) -> None:
    rng = np.random.default_rng()
    for (x_dtype, w_dtype), (m, n, k) in zip(
        MIXES, [(1, 257, 33), (7, 65, 7), (33, 70, 65), (65, 7, 257)], strict=True
    ):
        for wt in (False, True):
            x = rand(rng, (m, k), x_dtype)
            w = rand(rng, (n, k) if wt else (k, n), w_dtype)
            bias = rand(rng, (n,), bias_dtype) * 10
            close(await product(gpu, x, w, wt, bias), x, w, wt, bias)
    x = rand(rng, (2, 3, 16), "float32")  # batched, with the output allocated by the op
    w = rand(rng, (40, 16), "float16")
    bias = rand(rng, (40,), bias_dtype)
    got = gpu.ops.matmul(gpu.tensor(x), gpu.tensor(w), transpose_w=True, bias=gpu.tensor(bias))
    assert got.shape == (2, 3, 40) and got.dtype == np.float32
    close(await got.numpy(), x, w, True, bias)


@pytest.mark.parametrize("kind", ["matvec", "matmul"])
async def test_shared_weights_unfolded(gpu: gpud_client.Client, kind: str) -> None:
    """The daemon also takes a shared w with the batches as the grid's z (x_stride M*K, w_stride 0)."""
    rng = np.random.default_rng()
    b, m, n, k = 3, 2 if kind == "matvec" else 11, 37, 19
    x, w = rand(rng, (b, m, k), "float32"), rand(rng, (n, k), "float16")
    tx, tw = gpu.tensor(x), gpu.tensor(w)
    out = poisoned(gpu, (b, m, n), "float32")
    grid = matvec_grid(b, n, k, True) if kind == "matvec" else matmul_grid(b, m, n)
    gpu.ops._run(f"{kind}_f32_f16", grid, [tx, tw, tx, out], [b, m, n, k, m * k, 0, 1, 0], None)
    close(await out.numpy(), x, w, True)


@pytest.mark.parametrize("wt", [False, True], ids=["kn", "nk"])
@pytest.mark.parametrize("m", [12, 16, 32])
async def test_rows_in_groups_give_each_row_its_bits_alone(gpu: gpud_client.Client, m: int, wt: bool) -> None:
    """Past 8 rows, float32 activations still go to matvec, as equal groups of rows along z: a batch
    of sequences gives every sequence the bits it gets by itself (what merged decode steps rely on)."""
    rng = np.random.default_rng()
    n, k = 37, 264
    x, w = rand(rng, (m, k), "float32"), rand(rng, (n, k) if wt else (k, n), "float16")
    got = await product(gpu, x, w, wt)
    close(got, x, w, wt)
    tw = gpu.tensor(w)
    for row in (0, m // 2, m - 1):
        alone = await gpu.ops.matmul(gpu.tensor(x[row : row + 1]), tw, transpose_w=wt).numpy()
        np.testing.assert_array_equal(got[row], alone[0])


def test_rows_split_into_groups() -> None:
    """matvec_groups: equal groups of 4 to 8 rows up to 32 rows of one shared w, else None."""
    for m, groups in [(9, None), (12, (2, 6)), (16, (2, 8)), (20, (4, 5)), (32, (4, 8)), (31, None), (40, None)]:
        got = matvec_groups(plan((m, 5), (7, 5), True))
        assert (got and (got.batch, got.m)) == groups, m
        if got is not None:
            assert got.out_shape == (m, 7) and got.x_stride == got.m * 5 and got.w_stride == 0
    assert matvec_groups(plan((2, 8, 5), (2, 7, 5), True)) is None  # a weight matrix per batch


async def test_mismatches_are_typed_errors_in_the_client(gpu: gpud_client.Client) -> None:
    f32 = np.float32
    x, w = gpu.tensor(np.ones((4, 5), f32)), gpu.tensor(np.ones((5, 6), f32))
    cases: list[tuple[Callable[[], object], str]] = [
        (lambda: gpu.ops.matmul(x, gpu.tensor(np.ones((4, 6), f32))), "K=5"),
        (lambda: gpu.ops.matmul(x, w, transpose_w=True), "K=5"),
        (lambda: gpu.ops.matmul(gpu.tensor(np.ones((2, 4, 5), f32)), gpu.tensor(np.ones((3, 5, 6), f32))), "batch"),
        (lambda: gpu.ops.matmul(gpu.tensor(np.ones((), f32)), w), "no 0-d operand"),
        (lambda: gpu.ops.matmul(gpu.tensor(np.ones((2, 1, 4, 5), f32)), gpu.tensor(np.ones((3, 5, 6), f32))), "batch"),
        (lambda: gpu.ops.matmul(gpu.tensor(np.ones((4, 5), np.int32)), w), "float32, float16 or bfloat16"),
        (lambda: gpu.ops.matmul(x, w, out=gpu.empty((4, 7))), "out is"),
        (lambda: gpu.ops.matmul(x, w, out=gpu.empty((4, 6), "float16")), "out is float16"),
        (lambda: gpu.ops.matmul(x, w, bias=gpu.tensor(np.ones(5, f32))), "bias is"),
        (lambda: gpu.ops.matmul(x, w, bias=gpu.tensor(np.ones(6, np.int32))), "bias"),
        (lambda: gpu.ops.matmul(x, gpu.tensor(np.ones((5, 0), f32))), "empty"),
    ]
    for call, match in cases:
        with pytest.raises(InvalidArgument, match=match):
            call()
    got = gpu.ops.matmul(x, w)  # the session goes on
    np.testing.assert_array_equal(await got.numpy(), np.full((4, 6), 5, f32))


async def test_mismatches_are_typed_errors_in_the_daemon(gpu: gpud_client.Client) -> None:
    """A client that skips the library's checks: the daemon applies the same rule to each dispatch."""
    x, w = gpu.tensor(np.ones((2, 8), np.float32)), gpu.tensor(np.ones((3, 8), np.float32))
    out, half = gpu.empty((2, 3)), gpu.tensor(np.ones(3, np.float16))
    good = [1, 2, 3, 8, 0, 0, 1, 0]  # (2, 8) @ (3, 8)^T: batch 1, m 2, n 3, k 8, wt
    bad = [
        ("matvec_f32_f32", [x, w, x, out], {3: 7}, "sizes passed"),
        ("matvec_f32_f32", [x, w, x, out], {1: 1}, "sizes passed"),  # m does not cover x
        ("matvec_f32_f32", [x, w, x, out], {6: 0}, "K=8"),  # w read as (K, N)
        ("matvec_f32_f32", [x, w, x, out], {6: 2}, "wt is 0 or 1"),
        ("matvec_f32_f32", [x, w, half, out], {7: 1}, "bias kind 1"),
        ("matvec_f32_f32", [x, w, x, out], {7: 4}, "bias kind is"),
        ("matvec_f32_f32", [x, w, x, out], {7: 6 << 8}, "activation is"),
        ("matvec_f32_f32", [x, w, x, half], {}, "out is"),
        ("matvec_f16_f32", [x, w, x, out], {}, "takes x float16"),
        ("matmul_f32_f32", [x, w, x, gpu.empty((3, 2))], {}, "out is"),
    ]
    for name, tensors, changes, match in bad:
        scalars = [changes.get(i, v) for i, v in enumerate(good)]
        gpu.dispatch(gpu.ops._kernel(name), (1, 1, 1), [*tensors, *(u32(v) for v in scalars)])
        with pytest.raises(InvalidArgument, match=match) as info:
            await out.numpy()
        assert info.value.op == "dispatch"
        assert "matmul" in str(info.value)
    many = gpu.tensor(np.ones((9, 8), np.float32))
    gpu.dispatch(
        gpu.ops._kernel("matvec_f32_f32"),
        (1, 1, 1),
        [many, w, many, gpu.empty((9, 3)), *map(u32, [1, 9, 3, 8, 0, 0, 1, 0])],
    )
    with pytest.raises(InvalidArgument, match="at most 8 rows"):
        await out.numpy()
    gpu.dispatch(gpu.ops._kernel("matvec_f32_f32"), (1, 1, 1), [x, w, x, out, *map(u32, good)])
    np.testing.assert_array_equal(await out.numpy(), np.full((2, 3), 8, np.float32))


def test_the_rule_itself() -> None:
    """The check both sides run, directly: shapes, dtypes and the scalars they imply."""
    check = KERNELS["matmul_f32_f16"].check
    x, w, out = TensorInfo("float32", (3, 4, 5)), TensorInfo("float16", (6, 5)), TensorInfo("float32", (3, 4, 6))
    bias = TensorInfo("float16", (6,))
    check([x, w, bias, out], [1, 12, 6, 5, 0, 0, 1, 2])  # folded
    check([x, w, bias, out], [3, 4, 6, 5, 20, 0, 1, 2])  # unfolded
    check([x, w, bias, out], [2, 6, 6, 5, 30, 0, 1, 2])  # in groups of rows (matvec_groups)
    wrong = [
        ([x, w, bias, out], [3, 4, 6, 5, 0, 0, 1, 2], "sizes"),  # x_stride 0 with batches on z
        ([x, w, bias, out], [4, 6, 6, 5, 30, 0, 1, 2], "sizes"),  # groups past x's rows
        ([x, w, bias, out], [2, 6, 6, 5, 24, 0, 1, 2], "sizes"),  # groups that overlap
        ([x, w, bias, out], [1, 12, 6, 5, 0, 0, 0, 2], "K="),
        ([x, w, TensorInfo("float16", (5,)), out], [1, 12, 6, 5, 0, 0, 1, 2], "bias is"),
        ([x, w, bias, TensorInfo("float32", (12, 6))], [1, 12, 6, 5, 0, 0, 1, 0], "out is"),
        ([w, w, bias, out], [1, 12, 6, 5, 0, 0, 1, 0], "takes x float32"),
    ]
    for tensors, scalars, match in wrong:
        with pytest.raises(OpError, match=match):
            check(tensors, scalars)


async def test_matmul_records_into_a_replay_graph(gpu: gpud_client.Client) -> None:
    """A linear layer (float16 weight, bias) then a (K, N) projection, for one token and for 9."""
    rng = np.random.default_rng()
    w1, b1, w2 = rand(rng, (40, 24), "float16"), rand(rng, (40,), "float32"), rand(rng, (40, 17), "float32")
    t1, tb, t2 = gpu.tensor(w1), gpu.tensor(b1), gpu.tensor(w2)
    for tokens in (1, 9):
        g = gpu.graph(f"linear-{tokens}")
        x = g.input("x", (tokens, 24), "float32")
        h = gpu.ops.matmul(x, t1, transpose_w=True, bias=tb, graph=g)
        y = gpu.ops.matmul(h, t2, graph=g)
        g.output("y", y)
        step = await g.build()
        for _ in range(2):
            a = rand(rng, (tokens, 24), "float32")
            got = (await step.replay(x=a))["y"]
            h_ref, h_scale = reference(a, w1, True, b1)
            ref = h_ref @ w2.astype(np.float64)
            scale = h_scale @ np.abs(w2.astype(np.float64))
            assert not np.isnan(got).any()
            assert np.all(np.abs(got - ref) <= 2 * ACC_TOL * scale)

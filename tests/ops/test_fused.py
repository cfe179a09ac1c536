"""The fused decode ops on every backend: add_rmsnorm and silu_and_mul against numpy in float64 (the
stored sum bit-exact), rotary_kv_append against the unfused rotary and kv_append it replaces (both
styles, grouped heads, one step and several, positions dropped past either end of the cache, every
dtype of x and the caches), the rules each checks, and recording into a replay graph."""

from __future__ import annotations

import numpy as np
import pytest

import gpud_client
from gpud_client import InvalidArgument
from gpud_client.dtypes import bits_to_float32, float32_to_bits

TOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}  # relative to max(1, |ref|)


def stored(values: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values as a tensor of `dtype` holds them (as float32)."""
    v = np.asarray(values, np.float32)
    if dtype == "float16":
        return v.astype(np.float16).astype(np.float32)
    if dtype == "bfloat16":
        rounded: np.ndarray = bits_to_float32(float32_to_bits(v))
        return rounded
    return v


def upload(gpu: gpud_client.Client, values: np.ndarray, dtype: str) -> gpud_client.Tensor:
    return gpu.tensor(np.asarray(values, np.float32), dtype=dtype)


async def read(t: gpud_client.Tensor) -> np.ndarray:
    return np.asarray(await t.numpy(), np.float32)


def close(got: np.ndarray, ref: np.ndarray, dtype: str) -> None:
    assert got.shape == ref.shape
    err = np.abs(got.astype(np.float64) - ref) / np.maximum(1.0, np.abs(ref))
    assert np.isfinite(got).all() and err.max() <= TOL[dtype], err.max()


@pytest.mark.parametrize(
    ("dtype", "wdtype", "shape"),
    [
        ("float32", "float32", (3, 7)),
        ("float32", "float16", (2, 5, 896)),
        ("float16", "float32", (4, 514)),
        ("float16", "float16", (1, 6)),
        ("bfloat16", "bfloat16", (3, 64)),
        ("float32", "bfloat16", (1, 2000)),
    ],
)
async def test_add_rmsnorm_is_add_then_rmsnorm(
    gpu: gpud_client.Client, dtype: str, wdtype: str, shape: tuple[int, ...]
) -> None:
    rng = np.random.default_rng(7)
    x, r = stored(rng.standard_normal(shape), dtype), stored(rng.standard_normal(shape), dtype)
    w = stored(rng.standard_normal(shape[-1]), wdtype)
    total, normed = gpu.ops.add_rmsnorm(upload(gpu, x, dtype), upload(gpu, r, dtype), upload(gpu, w, wdtype), 1e-5)
    want_sum = stored(x + r, dtype)  # float32 arithmetic, rounded once
    if dtype == "float16":  # WGSL leaves the rounding of pack2x16float to the driver: within one step
        np.testing.assert_allclose(await read(total), want_sum, rtol=2.0**-10, atol=0)
    else:
        np.testing.assert_array_equal(await read(total), want_sum)
    s = want_sum.astype(np.float64)
    ref = s / np.sqrt((s * s).mean(-1, keepdims=True) + 1e-5) * w
    close(await read(normed), ref, dtype)


async def test_add_rmsnorm_into_given_outputs_and_its_rules(gpu: gpud_client.Client) -> None:
    x = gpu.tensor(np.ones((2, 8), np.float32))
    r = gpu.tensor(np.full((2, 8), 2.0, np.float32))
    w = gpu.tensor(np.full(8, 0.5, np.float32))
    s, o = gpu.empty((2, 8), "float32"), gpu.empty((2, 8), "float32")
    got = gpu.ops.add_rmsnorm(x, r, w, 0.0, out=o, sum_out=s)
    assert got == (s, o)
    np.testing.assert_allclose(await s.numpy(), np.full((2, 8), 3.0))
    np.testing.assert_allclose(await o.numpy(), np.full((2, 8), 0.5), rtol=1e-6)
    with pytest.raises(InvalidArgument, match="in place") as info:
        gpu.ops.add_rmsnorm(x, r, w, sum_out=x)
    assert info.value.op == "add_rmsnorm"
    with pytest.raises(InvalidArgument, match="odd"):
        half = gpu.tensor(np.ones((2, 7), np.float16))
        gpu.ops.add_rmsnorm(half, half, gpu.tensor(np.ones(7, np.float32)))
    with pytest.raises(InvalidArgument, match="one shape"):
        gpu.ops.add_rmsnorm(x, gpu.tensor(np.ones((1, 8), np.float32)), w)
    with pytest.raises(InvalidArgument, match="weight"):
        gpu.ops.add_rmsnorm(x, r, gpu.tensor(np.ones(7, np.float32)))


@pytest.mark.parametrize(
    ("dtype", "shape"), [("float32", (3, 2 * 5)), ("float16", (2, 2, 2 * 4864)), ("bfloat16", (1, 2 * 6))]
)
async def test_silu_and_mul_is_silu_of_the_first_half_times_the_second(
    gpu: gpud_client.Client, dtype: str, shape: tuple[int, ...]
) -> None:
    x = stored(np.random.default_rng(3).standard_normal(shape) * 3, dtype)
    got = await read(gpu.ops.silu_and_mul(upload(gpu, x, dtype)))
    half = shape[-1] // 2
    g, u = x[..., :half].astype(np.float64), x[..., half:].astype(np.float64)
    close(got, g / (1 + np.exp(-g)) * u, dtype)


async def test_silu_and_mul_rules(gpu: gpud_client.Client) -> None:
    with pytest.raises(InvalidArgument, match="not even") as info:
        gpu.ops.silu_and_mul(gpu.tensor(np.ones((2, 7), np.float32)))
    assert info.value.op == "silu_and_mul"
    with pytest.raises(InvalidArgument, match="odd"):
        gpu.ops.silu_and_mul(gpu.tensor(np.ones((2, 6), np.float16)))
    with pytest.raises(InvalidArgument, match="out is"):
        gpu.ops.silu_and_mul(gpu.tensor(np.ones((2, 8), np.float32)), out=gpu.empty((2, 8), "float32"))


CASES = [  # (x dtype, cache dtype, style, B, T, Hq, Hkv, D, L)
    ("float32", "float32", "neox", 2, 1, 4, 2, 8, 6),
    ("float32", "float16", "gptj", 3, 1, 2, 2, 64, 9),
    ("float32", "float16", "neox", 2, 3, 14, 2, 64, 8),
    ("float16", "float16", "neox", 1, 2, 2, 1, 4, 5),
    ("bfloat16", "float32", "gptj", 2, 1, 4, 1, 16, 4),
    ("float32", "bfloat16", "neox", 2, 1, 2, 2, 128, 3),
]


@pytest.mark.parametrize(("xd", "cd", "style", "b", "t", "hq", "hkv", "d", "length"), CASES)
async def test_rotary_kv_append_is_rotary_and_kv_append(
    gpu: gpud_client.Client, xd: str, cd: str, style: str, b: int, t: int, hq: int, hkv: int, d: int, length: int
) -> None:
    rng = np.random.default_rng(b * 100 + d)
    width = (hq + 2 * hkv) * d
    qkv = stored(rng.standard_normal((b, t, width)), xd)
    if t == 1:
        qkv = qkv[:, 0]
    positions = np.array([length - t + 1, -1, 1][:b], np.int32)  # the first runs past the end, -1 is dropped
    pos = gpu.tensor(positions)
    cache0 = stored(rng.standard_normal((b, length, hkv, d)), cd)
    fused_k, fused_v = upload(gpu, cache0, cd), upload(gpu, cache0 * 2, cd)
    q = gpu.ops.rotary_kv_append(
        upload(gpu, qkv, xd), fused_k, fused_v, pos, heads=hq, kv_heads=hkv, style=style, base=500.0
    )
    assert tuple(q.shape) == ((b, hq, d) if t == 1 else (b, t, hq, d))
    # The unfused way: split on the host, rotary on the device, kv_append.
    parts = qkv.reshape(b, t, hq + 2 * hkv, d)
    want_q = gpu.ops.rotary(upload(gpu, parts[:, :, :hq], xd), pos, style=style, base=500.0)
    want_k = gpu.ops.rotary(upload(gpu, parts[:, :, hq : hq + hkv], xd), pos, style=style, base=500.0)
    k, v = upload(gpu, cache0, cd), upload(gpu, cache0 * 2, cd)
    gpu.ops.kv_append(k, want_k, pos)
    gpu.ops.kv_append(v, upload(gpu, parts[:, :, hq + hkv :], xd), pos)
    tol = {"float32": 1e-6, "float16": 1e-3, "bfloat16": 8e-3}
    np.testing.assert_allclose((await read(q)).reshape(b, t, hq, d), await read(want_q), rtol=tol[xd], atol=tol[xd])
    np.testing.assert_allclose(await read(fused_k), await read(k), rtol=tol[cd], atol=tol[cd])
    np.testing.assert_array_equal(await read(fused_v), await read(v))
    want_v = stored(cache0 * 2, cd)  # on the host: the positions in 0 .. L-1 written, the rest as they were
    for row in range(b):
        for step in range(t):
            if 0 <= positions[row] + step < length:
                want_v[row, positions[row] + step] = stored(parts[row, step, hq + hkv :], cd)
    np.testing.assert_array_equal(await read(fused_v), want_v)


async def test_rotary_kv_append_rules(gpu: gpud_client.Client) -> None:
    cache = gpu.empty((1, 4, 1, 8), "float32")
    pos = gpu.tensor(np.zeros(1, np.int32))

    def call(qkv_shape: tuple[int, ...], heads: int = 2, kv_heads: int = 1, style: str = "neox") -> object:
        qkv, other = gpu.empty(qkv_shape, "float32"), gpu.empty((1, 4, 1, 8), "float32")
        return gpu.ops.rotary_kv_append(qkv, cache, other, pos, heads=heads, kv_heads=kv_heads, style=style)

    with pytest.raises(InvalidArgument, match="multiple of 4") as info:
        call((1, 4 * 6), heads=2, kv_heads=1)
    assert info.value.op == "rotary_kv_append"
    with pytest.raises(InvalidArgument, match="do not group"):
        call((1, 7 * 8), heads=3, kv_heads=2)
    with pytest.raises(InvalidArgument, match="style"):
        call((1, 4 * 8), style="llama")
    qkv = gpu.empty((1, 32), "float32")
    with pytest.raises(InvalidArgument, match="caches"):
        gpu.ops.rotary_kv_append(qkv, cache, gpu.empty((1, 4, 1, 8), "float16"), pos, heads=2, kv_heads=1)
    with pytest.raises(InvalidArgument, match="differ in shape"):
        gpu.ops.rotary_kv_append(qkv, cache, gpu.empty((1, 5, 1, 8), "float32"), pos, heads=2, kv_heads=1)


async def test_the_fused_ops_record_into_a_replay_graph(gpu: gpud_client.Client) -> None:
    rng = np.random.default_rng(5)
    x0, r0 = rng.standard_normal((2, 8)).astype(np.float32), rng.standard_normal((2, 8)).astype(np.float32)
    weight = gpu.tensor(np.ones(8, np.float32))
    g = gpu.graph("fused-ops")
    x, r = g.input("x", (2, 8), "float32"), g.input("r", (2, 8), "float32")
    total, normed = gpu.ops.add_rmsnorm(x, r, weight, 1e-6, graph=g)
    act = gpu.ops.silu_and_mul(normed, graph=g)
    g.output("sum", total)
    g.output("act", act)
    step = await g.build()
    got = await step.replay(x=x0, r=r0)
    np.testing.assert_array_equal(got["sum"], x0 + r0)
    s = (x0 + r0).astype(np.float64)
    n = s / np.sqrt((s * s).mean(-1, keepdims=True) + 1e-6)
    close(np.asarray(got["act"]), n[:, :4] / (1 + np.exp(-n[:, :4])) * n[:, 4:], "float32")
    step.free()


async def test_a_client_that_skips_the_library_checks_meets_the_same_rules_in_the_daemon(
    gpu: gpud_client.Client,
) -> None:
    """Raw dispatches of the fused kernels with lying sizes: refused by the daemon, naming the kernel, and
    nothing runs (the caches keep their bytes)."""
    u = gpud_client.u32
    qkv = gpu.tensor(np.ones((2, 32), np.float32))  # Hq 2, Hkv 1, D 8
    pos = gpu.tensor(np.zeros(2, np.int32))
    q = gpu.tensor(np.zeros((2, 2, 8), np.float32))
    k, v = (gpu.tensor(np.full((2, 4, 1, 8), 7.0, np.float32)) for _ in range(2))
    kernel = gpu.ops._kernel("rotary_kv_append_f32_f32")
    sizes = (16, 1, 2, 1, 8, 4, 0)
    for lie, what in (((17, *sizes[1:]), "n past qkv"), ((*sizes[:5], 40, 0), "a cache longer than it is")):
        gpu.dispatch(kernel, 1, [qkv, pos, q, k, v, *(u(s) for s in lie), 0.5, 0.0])
        with pytest.raises(InvalidArgument, match="rotary_kv_append") as info:
            await k.numpy()
        assert info.value.op == "dispatch", what
    np.testing.assert_array_equal(await k.numpy(), np.full((2, 4, 1, 8), 7.0, np.float32))
    x, out = gpu.tensor(np.ones((2, 8), np.float32)), gpu.tensor(np.zeros((2, 4), np.float32))
    gpu.dispatch(gpu.ops._kernel("silu_and_mul_f32"), 1, [x, out, u(8), u(5)])  # width past the half
    with pytest.raises(InvalidArgument, match="silu_and_mul"):
        await out.numpy()
    s, o = gpu.tensor(np.zeros((2, 8), np.float32)), gpu.tensor(np.zeros((2, 8), np.float32))
    w = gpu.tensor(np.ones(7, np.float32))
    gpu.dispatch(gpu.ops._kernel("add_rmsnorm_f32_f32"), (2, 1, 1), [x, x, w, s, o, u(2), u(8), 1e-6])
    with pytest.raises(InvalidArgument, match=r"add_rmsnorm.*weight"):  # a weight shorter than a row
        await o.numpy()

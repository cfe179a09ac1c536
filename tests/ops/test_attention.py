"""Attention ops against numpy in float64, on every backend: embedding, rotary, kv_append,
attention_decode and attention. Fresh random inputs, poisoned outputs (NaN never passes), positions
not at the start, GQA, both rotary styles, a KV cache past 65,536 positions, typed errors from the
client and the daemon, and a decode step recorded into a replay graph with `pos` as a graph input.

Tolerances (relative to max(1, |ref|)): float32 results 1e-5 (attention accumulates over up to 70,000
keys in float32); float16 results add float16's rounding (2^-11 relative). Rotary adds the angle's
float32 error, |position| * 2.5e-7 rad (the angle is rounded once to float32, as float32
implementations do), times |x_i| + |x_pair|.
"""

from __future__ import annotations

import math
import uuid
from typing import Any

import numpy as np
import pytest

import gpud_client
from gpud_client import InvalidArgument

DTYPES = ["float32", "float16"]
TOL = {"float32": 1e-5, "float16": 2e-5 + 2.0**-11}
ANGLE = 2.5e-7  # rad per unit of position: float32's error in the rotary angle


def poisoned(gpu: gpud_client.Client, shape: tuple[int, ...], dtype: str) -> gpud_client.Tensor:
    """An output filled with NaN: an element the op does not write fails the check."""
    return gpu.tensor(np.full(shape, np.nan, dtype))


def close(got: np.ndarray, ref: np.ndarray, tol: float, extra: Any = 0.0) -> None:
    got64 = got.astype(np.float64)
    assert got64.shape == ref.shape, (got64.shape, ref.shape)
    assert not np.isnan(got64).any(), "NaN (an unwritten or poisoned element)"
    bound = tol * np.maximum(1.0, np.abs(ref)) + extra
    err = np.abs(got64 - ref)
    assert np.all(err <= bound), f"max error {err.max():.3g}, worst error / bound {(err / bound).max():.3g}"


def positions(b: int, values: list[int]) -> np.ndarray:
    return np.array(values[:b], np.int32)


# ---------------------------------------------------------------------------------------- embedding


@pytest.mark.parametrize("out_dtype", DTYPES)
@pytest.mark.parametrize("table_dtype", DTYPES)
async def test_embedding_rows_and_zeros_for_ids_out_of_range(
    gpu: gpud_client.Client, table_dtype: str, out_dtype: str
) -> None:
    rng = np.random.default_rng()
    vocab, dim = 37, 19  # odd: float16 rows start mid-word
    table = rng.standard_normal((vocab, dim)).astype(table_dtype)
    ids = rng.integers(0, vocab, (3, 5)).astype(np.int32)
    ids[0, :4] = [-1, vocab, 1000, -(2**31)]
    ids[2, 4] = vocab - 1
    out = poisoned(gpu, (3, 5, dim), out_dtype)
    got = gpu.ops.embedding(gpu.tensor(ids), gpu.tensor(table), dtype=out_dtype, out=out)
    assert got is out
    valid = (ids >= 0) & (ids < vocab)
    ref = np.where(valid[..., None], table[np.clip(ids, 0, vocab - 1)], 0).astype(out_dtype)
    np.testing.assert_array_equal(await out.numpy(), ref)
    flat = gpu.ops.embedding(gpu.tensor(ids[1]), gpu.tensor(table), dtype=out_dtype)  # a new output, 1-D ids
    assert flat.shape == (5, dim) and np.dtype(flat.dtype).name == out_dtype
    np.testing.assert_array_equal(await flat.numpy(), ref[1])


# ---------------------------------------------------------------------------------------- rotary


def rotary_ref(x: np.ndarray, pos: np.ndarray, style: str, base: float) -> tuple[np.ndarray, np.ndarray]:
    """(rotated, the bound on the angle's error times |x_i| + |x_pair| per element), in float64."""
    x = x.astype(np.float64)
    _b, t, _h, d = x.shape
    inv = base ** (-2.0 * np.arange(d // 2) / d)
    where = pos.astype(np.float64)[:, None] + np.arange(t)  # (B, T)
    angle = where[:, :, None, None] * inv
    c, s = np.cos(angle), np.sin(angle)
    if style == "neox":
        a, b = x[..., : d // 2], x[..., d // 2 :]
    else:
        a, b = x[..., 0::2], x[..., 1::2]
    ra, rb = a * c - b * s, b * c + a * s
    slack = (np.abs(where) * ANGLE + 1e-7)[:, :, None, None] * (np.abs(a) + np.abs(b))
    out, bound = np.empty_like(x), np.empty_like(x)
    if style == "neox":
        out[..., : d // 2], out[..., d // 2 :] = ra, rb
        bound[..., : d // 2], bound[..., d // 2 :] = slack, slack
    else:
        out[..., 0::2], out[..., 1::2] = ra, rb
        bound[..., 0::2], bound[..., 1::2] = slack, slack
    return out, bound


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("style", ["neox", "gptj"])
async def test_rotary_styles_positions_not_at_the_start_and_in_place(
    gpu: gpud_client.Client, style: str, dtype: str
) -> None:
    rng = np.random.default_rng()
    for shape, pos, base in [((2, 5, 3, 64), [3, 130], 10000.0), ((3, 1, 14, 6), [0, 7, 1023], 1e6)]:
        a = rng.standard_normal(shape).astype(dtype)
        p = gpu.tensor(positions(shape[0], pos))
        ref, slack = rotary_ref(a, np.array(pos[: shape[0]]), style, base)
        out = poisoned(gpu, shape, dtype)
        gpu.ops.rotary(gpu.tensor(a), p, style=style, base=base, out=out)
        close(await out.numpy(), ref, TOL[dtype], slack)
        x = gpu.tensor(a)
        assert gpu.ops.rotary(x, p, style=style, base=base, out=x) is x  # in place
        close(await x.numpy(), ref, TOL[dtype], slack)
        fresh = gpu.ops.rotary(gpu.tensor(a), p, style=style, base=base)
        close(await fresh.numpy(), ref, TOL[dtype], slack)


async def test_rotary_far_positions(gpu: gpud_client.Client) -> None:
    """Positions past 65,535 (a 70,000-token cache): the angle is reduced before sin and cos."""
    rng = np.random.default_rng()
    a = rng.standard_normal((2, 9, 2, 64)).astype(np.float32)
    pos = np.array([40_000, 69_990], np.int32)
    for style in ("neox", "gptj"):
        out = poisoned(gpu, a.shape, "float32")
        gpu.ops.rotary(gpu.tensor(a), gpu.tensor(pos), style=style, base=1e6, out=out)
        ref, slack = rotary_ref(a, pos, style, 1e6)
        close(await out.numpy(), ref, TOL["float32"], slack)


# ---------------------------------------------------------------------------------------- kv_append


@pytest.mark.parametrize("x_dtype", DTYPES)
@pytest.mark.parametrize("cache_dtype", DTYPES)
async def test_kv_append_writes_its_positions_only_and_drops_those_past_the_cache(
    gpu: gpud_client.Client, cache_dtype: str, x_dtype: str
) -> None:
    rng = np.random.default_rng()
    batch, length, heads, dim = 3, 16, 2, 7
    expected = rng.standard_normal((batch, length, heads, dim)).astype(cache_dtype)
    cache = gpu.tensor(expected)
    for steps, pos in [(4, [3, 14, 0]), (1, [7, 16, 15]), (3, [-2, 100, 13])]:
        x = rng.standard_normal((batch, steps, heads, dim)).astype(x_dtype)
        gpu.ops.kv_append(cache, gpu.tensor(x), gpu.tensor(np.array(pos, np.int32)))
        for b in range(batch):
            for t in range(steps):
                if 0 <= pos[b] + t < length:
                    expected[b, pos[b] + t] = x[b, t].astype(cache_dtype)
        np.testing.assert_array_equal(await cache.numpy(), expected)


# ---------------------------------------------------------------------------------------- attention


def attention_ref(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    visible: np.ndarray,
    mask: np.ndarray | None = None,
    scale: float | None = None,
) -> np.ndarray:
    """q (B, T, Hq, D), k and v (B, S, Hkv, D), visible (B, T, S) bool, mask broadcast to (B, T, S)."""
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    rep = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, rep, axis=2), np.repeat(v, rep, axis=2)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = np.einsum("bthd,bshd->bhts", q, k) * scale
    if mask is not None:
        mask = np.broadcast_to(mask.reshape(-1, *mask.shape[-2:]), visible.shape)
        visible = visible & (mask > -1e30)
        scores = scores + np.where(visible, mask, 0)[:, None]
    seen = visible[:, None]
    scores = np.where(seen, scores, -np.inf)
    top = scores.max(axis=-1, keepdims=True)
    w = np.where(seen, np.exp(scores - np.where(np.isfinite(top), top, 0)), 0)
    total = w.sum(axis=-1, keepdims=True)
    out: np.ndarray = np.einsum("bhts,bshd->bthd", w / np.where(total > 0, total, 1), np.nan_to_num(v))
    return out


def decode_visible(pos: np.ndarray, length: int, steps: int = 1) -> np.ndarray:
    return np.arange(length)[None, None, :] <= (pos[:, None, None] + np.arange(steps)[None, :, None])


@pytest.mark.parametrize("kv_dtype", DTYPES)
@pytest.mark.parametrize("q_dtype", DTYPES)
async def test_attention_decode_gqa_against_the_cache_up_to_pos(
    gpu: gpud_client.Client, q_dtype: str, kv_dtype: str
) -> None:
    rng = np.random.default_rng()
    batch, length, hq, hkv, dim = 4, 300, 6, 2, 64
    q = rng.standard_normal((batch, hq, dim)).astype(q_dtype)
    kc = (rng.standard_normal((batch, length, hkv, dim)) * 2).astype(kv_dtype)
    vc = rng.standard_normal((batch, length, hkv, dim)).astype(kv_dtype)
    pos = np.array([0, 255, 256, 297], np.int32)  # tile edges; positions past pos[b] are never read:
    for b, p in enumerate(pos):
        kc[b, p + 1 :] = np.nan
        vc[b, p + 1 :] = np.nan
    ref = attention_ref(q[:, None], kc, vc, decode_visible(pos, length))[:, 0]
    k, v, p = gpu.tensor(kc), gpu.tensor(vc), gpu.tensor(pos)
    for splits in (None, 1, 2, 7):
        out = poisoned(gpu, (batch, hq, dim), "float32")
        gpu.ops.attention_decode(gpu.tensor(q), k, v, p, splits=splits, out=out)
        close(await out.numpy(), ref, TOL["float32"])
    got = gpu.ops.attention_decode(gpu.tensor(q), k, v, p, scale=0.3)  # q's dtype
    ref = attention_ref(q[:, None], kc, vc, decode_visible(pos, length), scale=0.3)[:, 0]
    close(await got.numpy(), ref, TOL[q_dtype])


async def test_attention_decode_positions_past_the_cache_and_negative(gpu: gpud_client.Client) -> None:
    rng = np.random.default_rng()
    q = rng.standard_normal((3, 2, 8)).astype(np.float32)
    kc, vc = (rng.standard_normal((3, 20, 1, 8)).astype(np.float32) for _ in range(2))
    pos = np.array([19, 500, -1], np.int32)
    out = gpu.ops.attention_decode(gpu.tensor(q), gpu.tensor(kc), gpu.tensor(vc), gpu.tensor(pos))
    got = await out.numpy()
    ref = attention_ref(q[:, None], kc, vc, decode_visible(np.array([19, 19, 19]), 20))[:, 0]
    close(got[:2], ref[:2], TOL["float32"])
    np.testing.assert_array_equal(got[2], 0)  # no key seen: zeros


async def test_attention_reuses_its_scratch_per_shape_and_keeps_a_bounded_number(gpu: gpud_client.Client) -> None:
    """Regression: every attention call allocated (and freed) a scratch tensor: a daemon handle per call,
    so nothing keyed by handles ever hit. Now one scratch per shape is kept, a bounded number of them."""
    rng = np.random.default_rng()
    q = rng.standard_normal((2, 4, 8)).astype(np.float32)
    kc, vc = (rng.standard_normal((2, 40, 2, 8)).astype(np.float32) for _ in range(2))
    pos = np.array([5, 39], np.int32)
    ref = attention_ref(q[:, None], kc, vc, decode_visible(pos, 40))[:, 0]
    qt, k, v, p, out = gpu.tensor(q), gpu.tensor(kc), gpu.tensor(vc), gpu.tensor(pos), gpu.empty(q.shape)
    gpu.ops.attention_decode(qt, k, v, p, out=out)
    await out.numpy()
    minted = next(gpu._handles)
    handles = (await gpu.stats())["session"]["handles"]
    for _ in range(5):
        out.upload(np.full(q.shape, np.nan, np.float32))
        gpu.ops.attention_decode(qt, k, v, p, out=out)
        close(await out.numpy(), ref, TOL["float32"])
    assert next(gpu._handles) == minted + 1  # no handle minted by the five calls
    assert (await gpu.stats())["session"]["handles"] == handles
    for splits in range(1, 13):  # a scratch shape per split count: the oldest scratch is freed past the bound
        gpu.ops.attention_decode(qt, k, v, p, splits=splits, out=out)
        close(await out.numpy(), ref, TOL["float32"])
    from gpud_client.ops.attention_split import SCRATCH_KEPT

    # the split counts a cluster merges (CUDA) need no scratch: the first call's (one split) among them
    scratched = [s for s in range(1, 13) if not gpu.ops._clusters(qt, s) or s not in (1, 2, 4, 8)]
    first = 1 if 1 in scratched else 0
    assert (await gpu.stats())["session"]["handles"] == handles - first + min(SCRATCH_KEPT, len(scratched))


async def test_attention_decode_a_chunk_of_new_tokens(gpu: gpud_client.Client) -> None:
    """q (B, T, Hq, D): query t sees the cache up to pos[b] + t (a chunk appended before)."""
    rng = np.random.default_rng()
    q = rng.standard_normal((2, 3, 4, 16)).astype(np.float32)
    kc, vc = (rng.standard_normal((2, 50, 2, 16)).astype(np.float16) for _ in range(2))
    pos = np.array([4, 47], np.int32)  # the second row's last query sees positions past the cache: all of it
    out = poisoned(gpu, q.shape, "float32")
    gpu.ops.attention_decode(gpu.tensor(q), gpu.tensor(kc), gpu.tensor(vc), gpu.tensor(pos), out=out)
    close(await out.numpy(), attention_ref(q, kc, vc, decode_visible(pos, 50, 3)), TOL["float32"])


async def test_attention_decode_a_cache_past_65536_positions(gpu: gpud_client.Client) -> None:
    """70,000 positions: every key counts (a key near the end dominates one head), none past pos."""
    rng = np.random.default_rng()
    length, hq, hkv, dim = 70_000, 4, 2, 64
    q = rng.standard_normal((1, hq, dim)).astype(np.float32)
    kc = rng.standard_normal((1, length, hkv, dim)).astype(np.float16)
    vc = rng.standard_normal((1, length, hkv, dim)).astype(np.float16)
    kc[0, 69_000, 0] = (q[0, 0] * 4).astype(np.float16)  # head 0 reads KV head 0: a peak near the end
    pos = np.array([69_990], np.int32)
    kc[0, 69_991:] = np.nan
    vc[0, 69_991:] = np.nan
    ref = attention_ref(q[:, None], kc, vc, decode_visible(pos, length))[:, 0]
    k, v, p = gpu.tensor(kc), gpu.tensor(vc), gpu.tensor(pos)
    for splits in (None, 1):
        out = poisoned(gpu, (1, hq, dim), "float32")
        gpu.ops.attention_decode(gpu.tensor(q), k, v, p, splits=splits, out=out)
        got = await out.numpy()
        close(got, ref, TOL["float32"])
    assert np.abs(ref[0, 0] - vc[0, 69_000, 0]).max() < 0.01  # the peak dominates: it was read


@pytest.mark.parametrize(
    ("q_dtype", "kv_dtype"), [("float32", "float32"), ("float16", "float16"), ("float32", "float16")]
)
async def test_attention_causal_and_masks(gpu: gpud_client.Client, q_dtype: str, kv_dtype: str) -> None:
    rng = np.random.default_rng()
    cases: list[tuple[int, int, int, int, int, int]] = [  # B, T, S, Hq, Hkv, D
        (2, 37, 37, 4, 2, 40),  # D does not divide 256
        (2, 5, 300, 3, 1, 64),
        (1, 3, 9, 2, 2, 256),
        (1, 4, 4, 1, 1, 3),
    ]
    for batch, steps, keys, hq, hkv, dim in cases:
        q = rng.standard_normal((batch, steps, hq, dim)).astype(q_dtype)
        k = (rng.standard_normal((batch, keys, hkv, dim)) * 2).astype(kv_dtype)
        v = rng.standard_normal((batch, keys, hkv, dim)).astype(kv_dtype)
        qt, kt, vt = gpu.tensor(q), gpu.tensor(k), gpu.tensor(v)
        everything = np.ones((batch, steps, keys), bool)
        causal = np.arange(keys)[None, None, :] <= np.arange(steps)[None, :, None] + (keys - steps)
        causal = np.broadcast_to(causal, everything.shape)
        shared = (rng.standard_normal((steps, keys)) * 3).astype(np.float32)
        padding = np.zeros((batch, 1, steps, keys), np.float32)  # (B, 1, T, S): batch row 0 hides its first keys
        padding[0, :, :, : keys // 2] = -np.inf
        padding[-1, :, :, -1] = np.finfo(np.float32).min
        for is_causal, mask, visible in [
            (False, None, everything),
            (True, None, causal),
            (False, shared, everything),
            (True, padding, causal),
        ]:
            out = poisoned(gpu, (batch, steps, hq, dim), "float32")
            m = None if mask is None else gpu.tensor(mask)
            gpu.ops.attention(qt, kt, vt, causal=is_causal, mask=m, out=out)
            # on CUDA, float16 with D 32/64/128 and no additive mask runs the flash kernel: P in float16
            flash = gpu.backend == "cuda" and q_dtype == kv_dtype == "float16" and dim in (32, 64, 128) and m is None
            close(await out.numpy(), attention_ref(q, k, v, visible, mask), 2e-3 if flash else TOL["float32"])


async def test_attention_rows_that_see_no_key_give_zeros(gpu: gpud_client.Client) -> None:
    rng = np.random.default_rng()
    q, k, v = (rng.standard_normal((1, 3, 2, 8)).astype(np.float32) for _ in range(3))
    mask = np.zeros((3, 3), np.float32)
    mask[1] = -np.inf
    got = await gpu.ops.attention(gpu.tensor(q), gpu.tensor(k), gpu.tensor(v), mask=gpu.tensor(mask)).numpy()
    np.testing.assert_array_equal(got[0, 1], 0)
    visible = np.ones((1, 3, 3), bool)
    visible[0, 1] = False
    close(got, attention_ref(q, k, v, visible), TOL["float32"])
    q5 = rng.standard_normal((1, 5, 2, 8)).astype(np.float32)  # causal with T > S: the first rows see nothing
    got = await gpu.ops.attention(gpu.tensor(q5), gpu.tensor(k), gpu.tensor(v), causal=True).numpy()
    causal = np.arange(3)[None, None, :] <= np.arange(5)[None, :, None] - 2
    close(got, attention_ref(q5, k, v, causal), TOL["float32"])


# ---------------------------------------------------------------------------------------- errors


async def test_mismatches_are_typed_errors_in_the_client_and_in_the_daemon(gpu: gpud_client.Client) -> None:
    f32 = np.float32
    x = gpu.tensor(np.ones((2, 3, 4, 8), f32))
    pos = gpu.tensor(np.zeros(2, np.int32))
    cache = gpu.tensor(np.zeros((2, 10, 4, 8), np.float16))
    with pytest.raises(InvalidArgument, match="style"):
        gpu.ops.rotary(x, pos, style="llama")
    with pytest.raises(InvalidArgument, match="even"):
        gpu.ops.rotary(gpu.tensor(np.ones((2, 3, 4, 7), f32)), pos)
    with pytest.raises(InvalidArgument, match="int32"):
        gpu.ops.rotary(x, gpu.tensor(np.zeros(2, f32)))
    with pytest.raises(InvalidArgument, match="pos"):
        gpu.ops.kv_append(cache, x, gpu.tensor(np.zeros(3, np.int32)))
    with pytest.raises(InvalidArgument, match="differ"):
        gpu.ops.kv_append(gpu.tensor(np.zeros((2, 10, 2, 8), f32)), x, pos)
    with pytest.raises(InvalidArgument, match="divide"):
        gpu.ops.attention(gpu.tensor(np.ones((2, 3, 6, 8), f32)), x, x)
    with pytest.raises(InvalidArgument, match="mask"):
        gpu.ops.attention(x, x, x, mask=gpu.tensor(np.zeros((3, 2), f32)))
    with pytest.raises(InvalidArgument, match="splits"):
        gpu.ops.attention_decode(gpu.tensor(np.ones((2, 4, 8), f32)), cache, cache, pos, splits=0)
    with pytest.raises(InvalidArgument, match="int32"):
        gpu.ops.embedding(gpu.tensor(np.zeros(3, f32)), gpu.tensor(np.ones((4, 8), f32)))
    with pytest.raises(InvalidArgument, match="out"):
        gpu.ops.attention(x, x, x, out=gpu.tensor(np.zeros((2, 3, 4, 8), np.int32)))
    # clients that skip the library's checks: the daemon applies the same rules
    u = gpud_client.u32
    kernel = gpu.ops._kernel("kv_append_f16_f32")
    gpu.dispatch(kernel, 1, [x, pos, cache, u(10_000), u(3), u(10), u(32)])  # n past x
    with pytest.raises(InvalidArgument, match="kv_append") as info:
        await cache.numpy()
    assert info.value.op == "dispatch"
    kernel = gpu.ops._kernel("attention_f32_f32")
    part = gpu.empty((2, 3, 4, 1, 10), "float32")
    args = [x, x, x, x, x, part, *(u(n) for n in (2, 3, 3, 4, 3, 8, 1, 0, 0, 0)), 0.5]  # 3 KV heads claimed
    gpu.dispatch(kernel, 24, args)
    with pytest.raises(InvalidArgument, match="attention"):
        await part.numpy()
    gpu.dispatch(kernel, 24, [x, x, x, x, x, part, *(u(n) for n in (2, 3, 3, 4, 4, 8, 1, 0, 0, 1)), 0.5])
    with pytest.raises(InvalidArgument, match="pos"):  # use_pos with x standing for pos
        await part.numpy()


# ---------------------------------------------------------------------------------------- graphs


async def test_a_decode_step_recorded_into_a_replay_graph_with_pos_as_an_input(gpu: gpud_client.Client) -> None:
    """rotary on q and k, kv_append of k and v, attention_decode: replayed per token with a fresh pos."""
    rng = np.random.default_rng()
    batch, length, hq, hkv, dim = 2, 40, 4, 2, 16
    g = gpu.graph("decode_step")
    q = g.input("q", (batch, 1, hq, dim), "float32")
    k_new = g.input("k", (batch, 1, hkv, dim), "float32")
    v_new = g.input("v", (batch, 1, hkv, dim), "float32")
    pos = g.input("pos", (batch,), "int32")
    kc = g.bind("k_cache", (batch, length, hkv, dim), "float16")
    vc = g.bind("v_cache", (batch, length, hkv, dim), "float16")
    with pytest.raises(InvalidArgument, match="one buffer"):  # in place on an input: not with pos an input too
        gpu.ops.rotary(q, pos, out=q, graph=g)
    q_rot = gpu.ops.rotary(q, pos, graph=g)
    k_rot = g.empty((batch, 1, hkv, dim), "float32")
    g.copy(k_new, k_rot)
    gpu.ops.rotary(k_rot, pos, out=k_rot, graph=g)  # in place on an intermediate
    gpu.ops.kv_append(kc, k_rot, pos, graph=g)
    gpu.ops.kv_append(vc, v_new, pos, graph=g)
    g.output("out", gpu.ops.attention_decode(q_rot, kc, vc, pos, graph=g))
    step = await g.build()

    host_k = np.zeros((batch, length, hkv, dim), np.float16)
    host_v = np.zeros((batch, length, hkv, dim), np.float16)
    k_cache, v_cache = gpu.tensor(host_k), gpu.tensor(host_v)
    start = np.array([0, 9], np.int32)  # the two sequences are at different positions
    for token in range(3):
        p = start + token
        a_q, a_k, a_v = (rng.standard_normal((batch, 1, h, dim)).astype(np.float32) for h in (hq, hkv, hkv))
        got = (await step.replay(q=a_q, k=a_k, v=a_v, pos=p, k_cache=k_cache, v_cache=v_cache))["out"]
        rq, _ = rotary_ref(a_q, p, "neox", 10000.0)
        rk, _ = rotary_ref(a_k, p, "neox", 10000.0)
        for b in range(batch):
            host_k[b, p[b]] = rk[b, 0].astype(np.float16)
            host_v[b, p[b]] = a_v[b, 0].astype(np.float16)
        dev_k, dev_v = await k_cache.numpy(), await v_cache.numpy()
        # the new key is rotated in float32, then rounded to float16: on the device and here, ulps may differ
        np.testing.assert_allclose(dev_k.astype(np.float64), host_k, rtol=2e-3, atol=1e-6)
        np.testing.assert_array_equal(dev_v, host_v)
        close(got, attention_ref(rq, dev_k, dev_v, decode_visible(p, length)), 1e-4)


async def test_attention_decode_in_a_graph_of_rows_gives_a_row_the_same_bits_in_every_instance(
    gpu: gpud_client.Client,
) -> None:
    """A graph of rows is built for several row counts, and a merged launch runs the instance that holds
    every session's rows: a row must get the bits it gets alone. The keys' split count (how many blocks
    share a row's keys, which sets the order of the sums) is therefore chosen by a row's own shape, not by
    the instance's rows: here 64 rows of 8 heads would take 2 splits, one row 4 (fill the GPU)."""
    rng = np.random.default_rng(7)
    length, hq, hkv, dim, sizes = 1024, 8, 2, 16, (1, 64)
    name = f"rows-attention-{uuid.uuid4().hex[:8]}"
    step = None
    for rows in sizes:
        g = gpu.graph(name, rows=True)
        q = g.input("q", (rows, hq, dim), "float32")
        k = g.input("k", (rows, length, hkv, dim), "float16")
        v = g.input("v", (rows, length, hkv, dim), "float16")
        pos = g.input("pos", (rows,), "int32")
        g.output("out", gpu.ops.attention_decode(q, k, v, pos, graph=g))
        step = await g.build()
    assert step is not None
    rows = sizes[-1]
    values: dict[str, np.ndarray[Any, Any]] = {
        "q": rng.standard_normal((rows, hq, dim)).astype(np.float32),
        "k": rng.standard_normal((rows, length, hkv, dim)).astype(np.float16),
        "v": rng.standard_normal((rows, length, hkv, dim)).astype(np.float16),
        "pos": rng.integers(300, length, rows).astype(np.int32),  # past the first 256 keys: several splits' share
    }
    together = (await step.replay(**values))["out"]
    for row in (0, 17, rows - 1):
        alone = (await step.replay(**{key: value[row : row + 1] for key, value in values.items()}))["out"]
        np.testing.assert_array_equal(alone[0], together[row], err_msg=f"row {row}")
    ref = attention_ref(values["q"][:, None], values["k"], values["v"], decode_visible(values["pos"], length))[:, 0]
    close(together, ref, TOL["float32"])

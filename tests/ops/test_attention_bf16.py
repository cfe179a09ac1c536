"""bfloat16 attention against numpy in float64, on every backend: q, k and v of bfloat16 (and either with
float32) through every kernel that computes them (WebGPU: attention_tiled and the split kernel; CUDA: the
flash kernel for bfloat16 q, k, v with D 32/64/128, and the split kernel), out in q's dtype or `out=`'s,
causal and key masks, GQA, head dims off the vector width, poisoned outputs, hidden keys of NaN; the
decode step against a bfloat16 cache (rotary and kv_append first, and a cache past 65,536 positions);
the tiled kernel at its longest sequence; float16 with bfloat16 refused by name; the rules; a replay.

Tolerances (relative to max(1, |ref|), as test_attention.py): float32 results 1e-5; a bfloat16 result
adds its rounding (2^-8). The flash kernel rounds P to bfloat16 before P V (flash attention's scheme):
that errs by at most 2^-8 of sum p |v| / sum p, the weighted mean of |v| (`flash_slack`), added on CUDA.
"""

from __future__ import annotations

import numpy as np
import pytest

import gpud_client
from gpud_client import InvalidArgument, u32
from gpud_protocol.ops import KERNELS, OpError, TensorInfo
from gpud_protocol.ops.attention_flash import FLASH_HEAD_DIMS, flash_applies
from gpud_protocol.ops.attention_tiled import TILED_HEAD_DIMS, tiled_applies
from ops.test_attention import TOL, attention_ref, close, decode_visible, rotary_ref
from ops.test_attention_tiled import longest, tiled
from ops.test_bfloat16 import bf

BF_TOL = 2e-5 + 2.0**-8
TOLS = {**TOL, "bfloat16": BF_TOL}
PAIRS = [("bfloat16", "bfloat16"), ("float32", "bfloat16"), ("bfloat16", "float32")]


def values(rng: np.random.Generator, shape: tuple[int, ...], dtype: str, scale: float = 1.0) -> np.ndarray:
    """Values exact in `dtype` (bfloat16's as float32)."""
    a = rng.standard_normal(shape) * scale
    return bf(a) if dtype == "bfloat16" else a.astype(dtype)


def tensor(gpu: gpud_client.Client, a: np.ndarray, dtype: str) -> gpud_client.Tensor:
    return gpu.tensor(a, dtype="bfloat16") if dtype == "bfloat16" else gpu.tensor(a.astype(dtype))


def poisoned(gpu: gpud_client.Client, shape: tuple[int, ...], dtype: str) -> gpud_client.Tensor:
    return tensor(gpu, np.full(shape, np.nan, np.float32), dtype)


def flash_runs(gpu: gpud_client.Client, q_dtype: str, kv_dtype: str, dim: int, out_dtype: str) -> bool:
    return (
        gpu.backend == "cuda"
        and q_dtype == kv_dtype == "bfloat16"
        and dim in FLASH_HEAD_DIMS
        and (out_dtype in ("float32", "bfloat16"))
    )


def flash_slack(q: np.ndarray, k: np.ndarray, v: np.ndarray, seen: np.ndarray) -> np.ndarray:
    """What rounding P to bfloat16 may cost: 2^-8 of the weighted mean of |v|, and float32's exp2 error."""
    return 2.0**-8 * attention_ref(q, k, np.abs(v), seen) + 1e-5


CASES = [  # B, T, S, Hq, Hkv, D: flash's dims, every width of attention_tiled, odd D (rows start mid-word)
    (2, 37, 37, 4, 2, 32),
    (1, 70, 66, 2, 2, 64),
    (1, 20, 17, 2, 1, 128),
    (2, 19, 23, 2, 1, 3),
    (1, 9, 9, 2, 1, 41),
    (1, 5, 40, 3, 3, 201),
]


@pytest.mark.parametrize(("q_dtype", "kv_dtype"), PAIRS)
async def test_attention_of_bfloat16_through_every_kernel(gpu: gpud_client.Client, q_dtype: str, kv_dtype: str) -> None:
    rng = np.random.default_rng()
    for b, t, s, hq, hkv, d in CASES:
        q = values(rng, (b, t, hq, d), q_dtype)
        k, v = values(rng, (b, s, hkv, d), kv_dtype, 1.5), values(rng, (b, s, hkv, d), kv_dtype)
        keep = np.arange(s)[None, :] < rng.integers(1, s + 1, b)[:, None]
        k[~keep], v[~keep] = np.nan, np.nan  # hidden by the key mask: never read
        kn, vn = np.nan_to_num(k), np.nan_to_num(v)
        seen = np.broadcast_to(keep[:, None, :], (b, t, s)) & (
            np.arange(s)[None, None, :] <= np.arange(t)[None, :, None] + (s - t)
        )
        ref = attention_ref(q, kn, vn, seen)
        qt, kt, vt = tensor(gpu, q, q_dtype), tensor(gpu, k, kv_dtype), tensor(gpu, v, kv_dtype)
        km = gpu.tensor(keep.astype(np.int32))
        for splits in (None, 1):  # the one-pass kernel of the backend, and the split kernel + combine
            for out_dtype in (None, "float32", "bfloat16"):
                out = None if out_dtype is None else poisoned(gpu, q.shape, out_dtype)
                got = gpu.ops.attention(qt, kt, vt, causal=True, key_mask=km, splits=splits, out=out)
                written = out_dtype or q_dtype
                assert got.dtype == written and (out is None or got is out)
                extra: float | np.ndarray = 0.0
                if flash_runs(gpu, q_dtype, kv_dtype, d, written):  # CUDA's flash kernel takes no `splits`
                    extra = flash_slack(q, kn, vn, seen)
                close(await got.numpy(), ref, TOLS[written], extra)
    used = set(gpu.ops._kernels)
    short = {"float32": "f32", "bfloat16": "bf16"}
    assert f"attention_{short[q_dtype]}_{short[kv_dtype]}" in used, used
    if gpu.backend == "cuda":  # an output of q's dtype: the splits merged in a cluster (attention_cluster)
        assert f"attention_s1_{short[q_dtype]}_{short[kv_dtype]}" in used, used
    else:
        assert "attention_combine_bf16" in used, used
    if gpu.backend == "webgpu":
        assert f"attention_tiled_d32_{short[q_dtype]}_{short[kv_dtype]}_bf16" in used, used
    elif q_dtype == kv_dtype:
        assert {"attention_flash_d32_bf16_bf16", "attention_flash_d64_bf16_f32"} <= used, used


async def test_a_float16_out_of_bfloat16_attention(gpu: gpud_client.Client) -> None:
    """out= of the other 16-bit dtype: no one-pass kernel has the mix, so the split kernel writes it."""
    rng = np.random.default_rng()
    q, k, v = (values(rng, (1, 6, 2, 32), "bfloat16") for _ in range(3))
    out = poisoned(gpu, q.shape, "float16")
    qt, kt, vt = (tensor(gpu, a, "bfloat16") for a in (q, k, v))
    assert gpu.ops.attention(qt, kt, vt, out=out) is out
    close(await out.numpy(), attention_ref(q, k, v, np.ones((1, 6, 6), bool)), TOL["float16"])


async def test_a_bfloat16_decode_step_rotary_append_attend(gpu: gpud_client.Client) -> None:
    """A bfloat16 model's decode step: rotary on q and k, kv_append into a bfloat16 cache, attention_decode
    over it (GQA, rows at different positions), with bfloat16 and float32 queries."""
    rng = np.random.default_rng()
    batch, length, hq, hkv, dim = 3, 40, 4, 2, 16
    kc, vc = values(rng, (batch, length, hkv, dim), "bfloat16"), values(rng, (batch, length, hkv, dim), "bfloat16")
    pos = np.array([0, 17, 39], np.int32)
    k_new, v_new = values(rng, (batch, 1, hkv, dim), "bfloat16"), values(rng, (batch, 1, hkv, dim), "bfloat16")
    k_cache, v_cache, p = tensor(gpu, kc, "bfloat16"), tensor(gpu, vc, "bfloat16"), gpu.tensor(pos)
    k_rot = gpu.ops.rotary(tensor(gpu, k_new, "bfloat16"), p)
    gpu.ops.kv_append(k_cache, k_rot, p)
    gpu.ops.kv_append(v_cache, tensor(gpu, v_new, "bfloat16"), p)
    rotated = await k_rot.numpy()
    close(rotated, rotary_ref(k_new, pos, "neox", 10000.0)[0], BF_TOL, 1e-5)
    kc[np.arange(batch), pos], vc[np.arange(batch), pos] = rotated[:, 0], v_new[:, 0]
    np.testing.assert_array_equal(await k_cache.numpy(), kc)
    for q_dtype in ("bfloat16", "float32"):
        q = values(rng, (batch, hq, dim), q_dtype)
        ref = attention_ref(q[:, None], kc, vc, decode_visible(pos, length))[:, 0]
        got = gpu.ops.attention_decode(tensor(gpu, q, q_dtype), k_cache, v_cache, p)
        assert got.dtype == q_dtype
        close(await got.numpy(), ref, TOLS[q_dtype])
        out = poisoned(gpu, q.shape, "bfloat16")
        gpu.ops.attention_decode(tensor(gpu, q, q_dtype), k_cache, v_cache, p, out=out)
        close(await out.numpy(), ref, BF_TOL)


async def test_attention_decode_a_bfloat16_cache_past_65536_positions(gpu: gpud_client.Client) -> None:
    """70,000 positions of bfloat16: every key counts (a key near the end dominates one head), none past pos."""
    rng = np.random.default_rng(65536)  # seeded, and a peak of 8 q: it dominates whatever the draw (4 did not)
    length, hq, hkv, dim = 70_000, 4, 2, 32
    q = values(rng, (1, hq, dim), "bfloat16")
    kc, vc = values(rng, (1, length, hkv, dim), "bfloat16"), values(rng, (1, length, hkv, dim), "bfloat16")
    kc[0, 69_000, 0] = bf(q[0, 0] * 8)  # head 0 reads KV head 0: a peak near the end
    pos = np.array([69_990], np.int32)
    kc[0, 69_991:], vc[0, 69_991:] = np.nan, np.nan
    ref = attention_ref(q[:, None], kc, vc, decode_visible(pos, length))[:, 0]
    k, v, p, qt = tensor(gpu, kc, "bfloat16"), tensor(gpu, vc, "bfloat16"), gpu.tensor(pos), tensor(gpu, q, "bfloat16")
    for splits in (None, 1):
        out = poisoned(gpu, (1, hq, dim), "float32")
        gpu.ops.attention_decode(qt, k, v, p, splits=splits, out=out)
        close(await out.numpy(), ref, TOL["float32"])
    assert np.abs(ref[0, 0] - vc[0, 69_000, 0]).max() < 0.01  # the peak dominates: it was read


@pytest.mark.parametrize("width", TILED_HEAD_DIMS)
async def test_the_tiled_kernels_longest_sequence_in_bfloat16(gpu: gpud_client.Client, width: int) -> None:
    """At the most keys attention_tiled takes (lavapipe's loop budget), the last key still counts."""
    if gpu.backend != "webgpu":
        pytest.skip("attention_tiled is WebGPU's")
    rng = np.random.default_rng(width)
    keys = longest(width)
    q = values(rng, (1, 16, 1, width), "bfloat16")
    q[0, -1, 0] = bf(q[0, -1, 0] * np.sqrt(width) / np.linalg.norm(q[0, -1, 0]))  # the peak dominates
    k, v = values(rng, (1, keys, 1, width), "bfloat16", 0.1), values(rng, (1, keys, 1, width), "bfloat16")
    k[0, keys - 1, 0] = bf(q[0, -1, 0] * 4)  # the last row's peak: the last key it sees
    got = tiled(gpu, *(tensor(gpu, a, "bfloat16") for a in (q, k, v)))  # attention_tiled itself
    ref = attention_ref(q, k, v, np.ones((1, 16, keys), bool))
    close(await got.numpy(), ref, BF_TOL)
    assert np.abs(ref[0, -1, 0] - v[0, keys - 1, 0]).max() < 0.05
    assert set(gpu.ops._kernels) == {f"attention_tiled_d{width}_bf16_bf16_bf16"}


async def test_float16_with_bfloat16_is_refused_by_name(gpu: gpud_client.Client) -> None:
    half = gpu.tensor(np.ones((1, 4, 2, 32), np.float16))
    brain = gpu.tensor(np.ones((1, 4, 2, 32), np.float32), dtype="bfloat16")
    for q, kv in [(half, brain), (brain, half)]:
        for splits in (None, 1):
            with pytest.raises(InvalidArgument, match=r"attention: q is .* cast one to the other's dtype") as info:
                gpu.ops.attention(q, kv, kv, splits=splits)
            assert info.value.op == "attention"
    pos = gpu.tensor(np.zeros(1, np.int32))
    with pytest.raises(InvalidArgument, match="attention_decode: q is bfloat16 and k, v float16"):
        gpu.ops.attention_decode(gpu.tensor(np.ones((1, 2, 32), np.float32), dtype="bfloat16"), half, half, pos)
    part = gpu.empty((1, 4, 2, 1, 34))
    gpu.dispatch(  # a client that skips the library's checks: the daemon's rule refuses it too
        gpu.ops._kernel("attention_bf16_bf16"),
        (8, 1, 1),
        [brain, half, half, brain, brain, part, *map(u32, [1, 4, 4, 2, 2, 32, 1, 0, 0, 0]), 0.125],
    )
    with pytest.raises(InvalidArgument, match="k and v are float16 and float16, not bfloat16"):
        await part.numpy()


async def test_bfloat16_attention_in_a_replay_graph(gpu: gpud_client.Client) -> None:
    rng = np.random.default_rng()
    keep = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], np.uint8)
    g = gpu.graph("bf16-attention")
    q, k, v = (g.input(name, (2, 5, 2, 32), "bfloat16") for name in ("q", "k", "v"))
    g.output("o", gpu.ops.attention(q, k, v, causal=True, key_mask=gpu.tensor(keep), graph=g))
    step = await g.build()
    for _ in range(2):
        a, b, c = (values(rng, (2, 5, 2, 32), "bfloat16") for _ in range(3))
        seen = keep.astype(bool)[:, None, :] & (np.arange(5)[None, None, :] <= np.arange(5)[None, :, None])
        extra = flash_slack(a, b, c, seen) if gpu.backend == "cuda" else 0.0
        close((await step.replay(q=a, k=b, v=c))["o"], attention_ref(a, b, c, seen), BF_TOL, extra)
    step.free()


def test_the_rules_and_the_routing() -> None:
    q, kv = TensorInfo("bfloat16", (2, 5, 6, 64)), TensorInfo("bfloat16", (2, 7, 2, 64))
    sizes = [2, 5, 7, 6, 2, 64, 0, 0, 0.125]
    for out_dtype, short in (("float32", "f32"), ("bfloat16", "bf16")):
        out = TensorInfo(out_dtype, q.shape)
        for name in (f"attention_flash_d64_bf16_{short}", f"attention_tiled_d64_bf16_bf16_{short}"):
            KERNELS[name].check([q, kv, kv, q, out], sizes)
            with pytest.raises(OpError, match="out is"):
                KERNELS[name].check([q, kv, kv, q, TensorInfo("float16", q.shape)], sizes)
            with pytest.raises(OpError, match="float16"):
                KERNELS[name].check([TensorInfo("float16", q.shape), kv, kv, q, out], sizes)
        KERNELS[f"attention_combine_{short}"].check([TensorInfo("float32", (2, 5, 6, 3, 66)), out], [out.size, 64, 3])
    assert flash_applies(q, kv, "bfloat16", None) and flash_applies(q, kv, "bfloat16", None, "float32")
    assert not flash_applies(q, kv, "bfloat16", None, "float16")  # no such kernel: the split one writes it
    assert not flash_applies(q, TensorInfo("float16", kv.shape), "float16", None)
    assert tiled_applies(q, kv, "bfloat16") and not tiled_applies(q, kv, "bfloat16", "float16")
    assert tiled_applies(TensorInfo("float32", q.shape), kv, "bfloat16", "float32")
    assert not tiled_applies(TensorInfo("float16", q.shape), kv, "bfloat16")
    assert not any({"f16", "bf16"} <= set(name.split("_")) for name in KERNELS if name.startswith("attention"))

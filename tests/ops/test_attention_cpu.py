"""attention_cpu, the one-pass attention lavapipe runs for head dims 32 and 64 (no workgroup memory, 4 query
rows a thread, keys two at a time), against numpy in float64: both widths, every (q, kv, out) dtype mix,
grouped heads, query rows past a thread's block, an odd number of keys, causal with T = S, T < S and T > S
(rows that see nothing give zeros), key masks of every dtype, hidden keys holding NaN (never read into a
result), poisoned outputs, a long sequence whose last key decides the result, a replay graph, which kernel
the client picks, and the rule (client and daemon).
"""

from __future__ import annotations

import numpy as np
import pytest

import gpud_client
from gpud_client import InvalidArgument, u32
from gpud_protocol.ops import KERNELS, OpError, TensorInfo
from gpud_protocol.ops.attention_cpu import CPU_HEAD_DIMS, cpu_applies, cpu_grid, cpu_name
from gpud_protocol.ops.attention_tiled import TILED_DTYPES
from ops.test_attention import attention_ref, close
from ops.test_attention_bf16 import TOLS, poisoned, tensor, values
from ops.test_attention_tiled import longest, software

CASES = [  # B, T, S, Hq, Hkv: rows past a block of 4, odd keys, grouped heads, T < S and T > S
    (2, 7, 9, 2, 1),
    (1, 13, 20, 4, 2),
    (3, 10, 5, 3, 3),
]
MASKS = ["uint8", "int32", "float32", "int64", "bool"]


def cpu_only(gpu: gpud_client.Client) -> None:
    if not software(gpu):
        pytest.skip("attention_cpu is a software adapter's (lavapipe)")


def draw(
    rng: np.random.Generator, case: tuple[int, ...], dim: int, q_dtype: str, kv_dtype: str
) -> tuple[np.ndarray, ...]:
    b, t, s, hq, hkv = case
    q = values(rng, (b, t, hq, dim), q_dtype)
    k = values(rng, (b, s, hkv, dim), kv_dtype, 2.0)
    v = values(rng, (b, s, hkv, dim), kv_dtype)
    keep = rng.random((b, s)) < 0.7
    keep[:, -1] = True
    return q, k, v, keep


@pytest.mark.parametrize("dim", CPU_HEAD_DIMS)
@pytest.mark.parametrize(("q_dtype", "kv_dtype", "out_dtype"), TILED_DTYPES)
async def test_every_dtype_mix_mask_and_causal_case(
    gpu: gpud_client.Client, dim: int, q_dtype: str, kv_dtype: str, out_dtype: str
) -> None:
    cpu_only(gpu)
    rng = np.random.default_rng()
    for case, mask_dtype in zip(CASES, MASKS[: len(CASES)], strict=True):
        b, t, s, hq, _hkv = case
        q, k, v, keep = draw(rng, case, dim, q_dtype, kv_dtype)
        kn, vn = k.copy(), v.copy()
        k[~keep], v[~keep] = np.nan, np.nan  # hidden by the key mask: must not reach any result
        qt, kt, vt = tensor(gpu, q, q_dtype), tensor(gpu, k, kv_dtype), tensor(gpu, v, kv_dtype)
        causal = np.arange(s)[None, None, :] <= np.arange(t)[None, :, None] + (s - t)
        key_seen = np.broadcast_to(keep[:, None, :], (b, t, s))
        for is_causal, key_mask, seen in [
            (False, None, np.ones((b, t, s), bool)),
            (False, keep.astype(mask_dtype), key_seen),
            (True, keep.astype(mask_dtype), key_seen & causal),
        ]:
            real = (qt, tensor(gpu, kn, kv_dtype), tensor(gpu, vn, kv_dtype))  # nothing hidden: no NaN
            qkv = real if key_mask is None else (qt, kt, vt)
            out = poisoned(gpu, (b, t, hq, dim), out_dtype)
            km = None if key_mask is None else gpu.tensor(key_mask)
            gpu.ops.attention(*qkv, causal=is_causal, key_mask=km, out=out)
            ref = attention_ref(q, kn, vn, seen)
            close(await out.numpy(), ref, TOLS[out_dtype])
    assert cpu_name(q_dtype, kv_dtype, out_dtype, dim) in gpu.ops._kernels, set(gpu.ops._kernels)
    assert not {name for name in gpu.ops._kernels if name.startswith("attention_tiled")}


async def test_the_key_mask_of_every_dtype_and_rows_that_see_nothing(gpu: gpud_client.Client) -> None:
    cpu_only(gpu)
    rng = np.random.default_rng()
    b, t, s, h, dim = 3, 6, 11, 2, 32
    q, k, v, keep = draw(rng, (b, t, s, h, h), dim, "float32", "float32")
    keep[0] = False  # the first batch row sees no key: zeros
    keep[1, :] = np.arange(s) == s - 1  # the second only its last key
    k[~keep], v[~keep] = np.nan, np.nan
    qt, kt, vt = gpu.tensor(q), gpu.tensor(k), gpu.tensor(v)
    seen = np.broadcast_to(keep[:, None, :], (b, t, s))
    for mask_dtype in MASKS:
        got = await gpu.ops.attention(qt, kt, vt, key_mask=gpu.tensor(keep.astype(mask_dtype))).numpy()
        close(got, attention_ref(q, np.nan_to_num(k), np.nan_to_num(v), seen), TOLS["float32"])
        np.testing.assert_array_equal(got[0], 0)
    # causal with T > S: the first T - S rows see no key
    q2 = values(rng, (1, 9, 2, 64), "float16")
    k2, v2 = values(rng, (1, 4, 2, 64), "float16"), values(rng, (1, 4, 2, 64), "float16")
    got = await gpu.ops.attention(gpu.tensor(q2), gpu.tensor(k2), gpu.tensor(v2), causal=True).numpy()
    causal = np.arange(4)[None, None, :] <= np.arange(9)[None, :, None] - 5
    close(got, attention_ref(q2, k2, v2, causal), TOLS["float16"])
    np.testing.assert_array_equal(got[0, :5], 0)


async def test_a_long_sequence_whose_last_key_decides(gpu: gpud_client.Client) -> None:
    """The most keys the client sends to attention_cpu (attention_tiled's budget, which it shares): ~14,000
    iterations of its key loop, and the last key must still count."""
    cpu_only(gpu)
    rng = np.random.default_rng(1)
    keys = longest(32)
    q = rng.standard_normal((1, 16, 1, 32)).astype(np.float32)  # 16 rows: fewer go to the split kernel
    q[0, -1, 0] *= np.sqrt(32) / np.linalg.norm(q[0, -1, 0])
    k = (rng.standard_normal((1, keys, 1, 32)) * 0.1).astype(np.float16)
    v = rng.standard_normal(k.shape).astype(np.float16)
    k[0, -1, 0] = (q[0, -1, 0] * 4).astype(np.float16)  # the last row's peak: the very last key
    got = await gpu.ops.attention(gpu.tensor(q), gpu.tensor(k), gpu.tensor(v)).numpy()
    ref = attention_ref(q, k, v, np.ones((1, 16, keys), bool))
    close(got, ref, TOLS["float32"])
    assert np.abs(ref[0, -1, 0] - v[0, -1, 0]).max() < 0.05  # the peak dominates: it was read
    assert set(gpu.ops._kernels) == {"attention_cpu_d32_f32_f16_f32"}


async def test_what_goes_elsewhere(gpu: gpud_client.Client) -> None:
    """An additive mask, or a head dim other than 32 and 64, goes to attention_tiled."""
    cpu_only(gpu)
    rng = np.random.default_rng()
    q, k, v = (rng.standard_normal((1, 5, 2, 32)).astype(np.float32) for _ in range(3))
    mask = np.zeros((5, 5), np.float32)
    mask[:, 0] = -np.inf
    got = await gpu.ops.attention(gpu.tensor(q), gpu.tensor(k), gpu.tensor(v), mask=gpu.tensor(mask)).numpy()
    close(got, attention_ref(q, k, v, np.ones((1, 5, 5), bool), mask), TOLS["float32"])
    q3 = rng.standard_normal((1, 5, 2, 48)).astype(np.float32)
    close(
        await gpu.ops.attention(*(gpu.tensor(q3) for _ in range(3))).numpy(),
        attention_ref(q3, q3, q3, np.ones((1, 5, 5), bool)),
        TOLS["float32"],
    )
    assert set(gpu.ops._kernels) == {"attention_tiled_d32_f32_f32_f32", "attention_tiled_d64_f32_f32_f32"}


async def test_an_encoder_layers_attention_in_a_replay_graph(gpu: gpud_client.Client) -> None:
    cpu_only(gpu)
    rng = np.random.default_rng()
    b, t, h, dim = 2, 9, 3, 32
    g = gpu.graph("cpu-attention")
    qkv = [g.input(name, (b, t, h, dim), "float16") for name in "qkv"]
    mask = g.input("mask", (b, t), "float32")
    g.output("out", gpu.ops.attention(*qkv, key_mask=mask, graph=g))
    step = await g.build()
    for _ in range(2):
        q, k, v = (values(rng, (b, t, h, dim), "float16") for _ in range(3))
        keep = (np.arange(t)[None, :] < np.array([[t], [4]])).astype(np.float32)
        got = (await step.replay(q=q, k=k, v=v, mask=keep))["out"]
        close(got, attention_ref(q, k, v, np.broadcast_to(keep[:, None, :] != 0, (b, t, t))), TOLS["float16"])


async def test_the_daemon_checks_a_cpu_dispatch(gpu: gpud_client.Client) -> None:
    """A client that skips the library's checks: the daemon refuses a head dim other than W, an additive
    mask, and what attention_tiled's rule refuses."""
    cpu_only(gpu)
    kernel = gpu.ops._kernel("attention_cpu_d32_f32_f32_f32")
    x = gpu.tensor(np.ones((2, 3, 4, 16), np.float32))
    out = gpu.empty((2, 3, 4, 16), "float32")
    gpu.dispatch(kernel, cpu_grid(2, 3, 4), [x, x, x, x, out, *(u32(n) for n in (2, 3, 3, 4, 4, 16, 0, 0)), 0.25])
    with pytest.raises(InvalidArgument, match="head dim of 32"):
        await out.numpy()
    y = gpu.tensor(np.ones((2, 3, 4, 32), np.float32))
    out32 = gpu.empty((2, 3, 4, 32), "float32")
    mask = gpu.tensor(np.zeros((3, 3), np.float32))
    gpu.dispatch(kernel, cpu_grid(2, 3, 4), [y, y, y, mask, out32, *(u32(n) for n in (2, 3, 3, 4, 4, 32, 0, 1)), 0.25])
    with pytest.raises(InvalidArgument, match="additive mask"):
        await out32.numpy()
    gpu.dispatch(kernel, cpu_grid(2, 3, 4), [y, y, y, y, out32, *(u32(n) for n in (2, 3, 3, 4, 4, 32, 0, 0)), 0.25])
    np.testing.assert_allclose(await out32.numpy(), 1.0)  # the session goes on


def test_the_rule_and_the_choice() -> None:
    check = KERNELS["attention_cpu_d64_f16_f16_f16"].check
    q, kv, out = (
        TensorInfo("float16", (2, 5, 4, 64)),
        TensorInfo("float16", (2, 7, 2, 64)),
        TensorInfo("float16", (2, 5, 4, 64)),
    )
    key_mask = TensorInfo("uint8", (2, 7))
    check([q, kv, kv, key_mask, out], [2, 5, 7, 4, 2, 64, 1, 3, 0.125])
    check([q, kv, kv, q, out], [2, 5, 7, 4, 2, 64, 0, 0, 0.125])
    with pytest.raises(OpError, match="additive"):
        check([q, kv, kv, TensorInfo("float32", (5, 7)), out], [2, 5, 7, 4, 2, 64, 0, 1, 0.125])
    with pytest.raises(OpError, match="out is"):
        check([q, kv, kv, q, TensorInfo("float32", (2, 5, 4, 64))], [2, 5, 7, 4, 2, 64, 0, 0, 0.125])
    assert cpu_applies(q, kv, "float16", "float16", False)
    assert not cpu_applies(q, kv, "float16", "float16", True)  # an additive mask
    q48 = TensorInfo("float16", (2, 5, 4, 48))
    assert not cpu_applies(q48, TensorInfo("float16", (2, 7, 2, 48)), "float16", "float16", False)
    far = TensorInfo("float16", (1, 100_000, 1, 32))
    assert not cpu_applies(TensorInfo("float16", (1, 5, 1, 32)), far, "float16", "float16", False)
    assert cpu_grid(16, 60, 12) == (45, 1, 1) and cpu_grid(1, 1, 1) == (1, 1, 1)
    names = {name for name in KERNELS if name.startswith("attention_cpu_")}
    assert names == {cpu_name(a, b, c, w) for w in CPU_HEAD_DIMS for a, b, c in TILED_DTYPES}

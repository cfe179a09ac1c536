"""attention with a key mask (B, S) (Hugging Face's attention_mask) and the flash kernel, on every backend,
against numpy in float64: every key-mask dtype, fully masked rows (zeros, never NaN), causal with T = S,
T < S and T > S, grouped heads, head sizes 32/64/128, odd lengths and S = 1; in a replay graph; the
rule of the flash kernel itself.

On CUDA, float16 q/k/v with D in 32/64/128 run the flash kernel (tensor cores): P is rounded to float16
before P V, so those results are held to 2e-3 of max(1, |ref|) (float16's 2^-11 and float32's rounding
of the output), the rest to the two-pass kernel's 1e-5, plus float16's rounding where the output is
float16 (q's dtype, when no out is given). Hidden keys hold NaN: they must never be read.
"""

from __future__ import annotations

import numpy as np
import pytest

import gpud_client
from gpud_client import InvalidArgument, u32
from gpud_protocol.ops import KERNELS, OpError, TensorInfo
from gpud_protocol.ops.attention import KEY_MASK_MODES
from gpud_protocol.ops.attention_flash import FLASH_HEAD_DIMS
from ops.test_attention import TOL, attention_ref, close, poisoned

FLASH_TOL = 2e-3


def tolerance(gpu: gpud_client.Client, dtype: str, dim: int, out_dtype: str = "float32") -> float:
    flash = gpu.backend == "cuda" and dtype == "float16" and dim in FLASH_HEAD_DIMS
    return max(FLASH_TOL if flash else 0.0, TOL[out_dtype])


def inputs(
    rng: np.random.Generator, shape: tuple[int, int, int, int, int, int], dtype: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    b, t, s, hq, hkv, d = shape
    q = rng.standard_normal((b, t, hq, d)).astype(dtype)
    k = (rng.standard_normal((b, s, hkv, d)) * 1.5).astype(dtype)
    v = rng.standard_normal((b, s, hkv, d)).astype(dtype)
    return q, k, v


def visible(b: int, t: int, s: int, causal: bool, keep: np.ndarray | None) -> np.ndarray:
    seen = np.ones((b, t, s), bool)
    if causal:
        seen &= np.arange(s)[None, None, :] <= np.arange(t)[None, :, None] + (s - t)
    if keep is not None:
        seen &= keep[:, None, :]
    return seen


def padding(rng: np.random.Generator, b: int, s: int) -> np.ndarray:
    """Rows of several lengths; row 0 sees nothing, row 2 (if any) has holes, the last sees everything."""
    keep = np.arange(s)[None, :] < rng.integers(1, s + 1, b)[:, None]
    keep[0] = False
    if b > 2:
        keep[2] = rng.random(s) < 0.5
    keep[-1] = True
    return keep


@pytest.mark.parametrize("mask_dtype", list(KEY_MASK_MODES))
async def test_attention_key_mask_of_every_dtype(gpu: gpud_client.Client, mask_dtype: str) -> None:
    rng = np.random.default_rng()
    cases = [  # B, T, S, Hq, Hkv, D; dtype
        ((4, 62, 62, 3, 3, 32), "float16"),
        ((3, 37, 37, 4, 2, 64), "float16"),
        ((3, 19, 70, 2, 1, 128), "float16"),
        ((3, 9, 9, 2, 1, 40), "float16"),  # not a flash head size: the two-pass kernel
        ((3, 21, 21, 4, 2, 32), "float32"),
    ]
    for shape, dtype in cases:
        b, t, s, hq, _hkv, d = shape
        q, k, v = inputs(rng, shape, dtype)
        keep = padding(rng, b, s)
        for causal in (False, True):
            # hidden keys: large (they would dominate if not hidden), then NaN (they are never read)
            k[~keep], v[~keep] = (np.nan, np.nan) if causal else (8.0, 1000.0)
            out = poisoned(gpu, (b, t, hq, d), "float32")
            key_mask = gpu.tensor(keep.astype(mask_dtype))
            got = gpu.ops.attention(
                gpu.tensor(q), gpu.tensor(k), gpu.tensor(v), causal=causal, key_mask=key_mask, out=out
            )
            assert got is out
            result = await out.numpy()
            np.testing.assert_array_equal(result[0], 0)  # a batch row that sees no key: zeros, not NaN
            ref = attention_ref(q, np.nan_to_num(k), np.nan_to_num(v), visible(b, t, s, causal, keep))
            close(result, ref, tolerance(gpu, dtype, d))
    flash = {name for name in gpu.ops._kernels if name.startswith("attention_flash")}
    assert flash == (
        {"attention_flash_d32_f32", "attention_flash_d64_f32", "attention_flash_d128_f32"}
        if gpu.backend == "cuda"
        else set()
    )


@pytest.mark.parametrize("dim", FLASH_HEAD_DIMS)
async def test_attention_causal_grouped_heads_and_odd_lengths(gpu: gpud_client.Client, dim: int) -> None:
    rng = np.random.default_rng()
    cases = [  # B, T, S, Hq, Hkv
        (2, 65, 65, 6, 2),  # one row past a 64-row tile
        (1, 33, 130, 4, 1),  # T < S: a chunk after 97 earlier keys
        (2, 40, 23, 2, 2),  # T > S: the first 17 rows see nothing
        (3, 1, 1, 2, 1),
        (2, 1, 77, 4, 4),
    ]
    for b, t, s, hq, hkv in cases:
        q, k, v = inputs(rng, (b, t, s, hq, hkv, dim), "float16")
        qt, kt, vt = gpu.tensor(q), gpu.tensor(k), gpu.tensor(v)
        for causal in (True, False):
            got = await gpu.ops.attention(qt, kt, vt, causal=causal).numpy()
            close(
                got, attention_ref(q, k, v, visible(b, t, s, causal, None)), tolerance(gpu, "float16", dim, "float16")
            )
        keep = padding(rng, b, s) if b > 1 else np.ones((b, s), bool)
        got = await gpu.ops.attention(qt, kt, vt, causal=True, key_mask=gpu.tensor(keep.astype(np.uint8))).numpy()
        close(got, attention_ref(q, k, v, visible(b, t, s, True, keep)), tolerance(gpu, "float16", dim, "float16"))


async def test_attention_with_a_key_mask_records_into_a_replay_graph(gpu: gpud_client.Client) -> None:
    """The key mask as a graph input: one capture, replayed with fresh masks."""
    rng = np.random.default_rng()
    b, t, h, d = 3, 20, 2, 32
    g = gpu.graph("encoder-attention")
    q = g.input("q", (b, t, h, d), "float16")
    k = g.input("k", (b, t, h, d), "float16")
    v = g.input("v", (b, t, h, d), "float16")
    key_mask = g.input("mask", (b, t), "int32")
    g.output("out", gpu.ops.attention(q, k, v, key_mask=key_mask, graph=g))
    step = await g.build()
    for _ in range(2):
        aq, ak, av = inputs(rng, (b, t, t, h, h, d), "float16")
        keep = padding(rng, b, t)
        got = (await step.replay(q=aq, k=ak, v=av, mask=keep.astype(np.int32)))["out"]
        assert got.dtype == np.float16  # q's dtype
        close(got, attention_ref(aq, ak, av, visible(b, t, t, False, keep)), tolerance(gpu, "float16", d, "float16"))


async def test_key_mask_mistakes_are_typed_errors(gpu: gpud_client.Client) -> None:
    x = gpu.tensor(np.ones((2, 3, 4, 32), np.float16))
    with pytest.raises(InvalidArgument, match="not both"):
        gpu.ops.attention(x, x, x, mask=gpu.tensor(np.zeros((3, 3), np.float32)), key_mask=gpu.tensor(np.ones((2, 3))))
    with pytest.raises(InvalidArgument, match="key mask"):
        gpu.ops.attention(x, x, x, key_mask=gpu.tensor(np.ones((2, 4), np.int32)))  # S is 3
    with pytest.raises(InvalidArgument, match="key mask is float16"):
        gpu.ops.attention(x, x, x, key_mask=gpu.tensor(np.ones((2, 3), np.float16)))
    x32 = gpu.tensor(np.ones((2, 3, 4, 8), np.float32))  # the two-pass kernel checks the key mask too
    with pytest.raises(InvalidArgument, match="key mask"):
        gpu.ops.attention(x32, x32, x32, key_mask=gpu.tensor(np.ones((3, 2), np.uint8)))


async def test_the_daemon_checks_a_flash_dispatch_too(gpu: gpud_client.Client) -> None:
    """A client that skips the library's checks: the daemon applies the flash kernel's rule."""
    if gpu.backend != "cuda":
        pytest.skip("the flash kernel is CUDA's")
    x = gpu.tensor(np.ones((2, 3, 4, 32), np.float16))
    out = gpu.empty((2, 3, 4, 32), "float32")
    kernel = gpu.ops._kernel("attention_flash_d32_f32")
    sizes = [u32(n) for n in (2, 3, 3, 4, 3, 32, 0, 0)]  # 3 KV heads claimed
    gpu.dispatch(kernel, (1, 4, 2), [x, x, x, x, out, *sizes, 0.5])
    with pytest.raises(InvalidArgument, match="attention_flash_d32_f32"):
        await out.numpy()
    sizes = [u32(n) for n in (2, 3, 3, 4, 4, 32, 0, 4)]  # an int32 key mask claimed, x passed
    gpu.dispatch(kernel, (1, 4, 2), [x, x, x, x, out, *sizes, 0.5])
    with pytest.raises(InvalidArgument, match="key mask"):
        await out.numpy()


def test_the_flash_rule_itself() -> None:
    """What the client and the daemon check before a flash kernel runs (no device needed)."""
    check = KERNELS["attention_flash_d64_f32"].check
    q, kv = TensorInfo("float16", (2, 5, 6, 64)), TensorInfo("float16", (2, 7, 2, 64))
    out, mask = TensorInfo("float32", (2, 5, 6, 64)), TensorInfo("int64", (2, 7))
    check([q, kv, kv, mask, out], [2, 5, 7, 6, 2, 64, 1, 6, 0.125])
    check([q, kv, kv, q, out], [2, 5, 7, 6, 2, 64, 0, 0, 0.125])  # no key mask: q stands in, unread
    wrong = [
        ([q, kv, kv, mask, out], [2, 5, 7, 6, 2, 64, 1, 4, 0.125], "mask mode passed"),  # int64 is mode 6
        ([q, kv, kv, mask, out], [2, 5, 7, 6, 2, 64, 1, 1, 0.125], "key mask only"),
        ([q, kv, kv, TensorInfo("int32", (2, 5)), out], [2, 5, 7, 6, 2, 64, 0, 4, 0.125], r"\[2, 7\]"),
        ([q, kv, kv, q, TensorInfo("float16", (2, 5, 6, 64))], [2, 5, 7, 6, 2, 64, 0, 0, 0.125], "out is"),
        ([q, kv, kv, q, out], [2, 5, 7, 6, 3, 64, 0, 0, 0.125], "sizes"),
        ([TensorInfo("float32", (2, 5, 6, 64)), kv, kv, q, out], [2, 5, 7, 6, 2, 64, 0, 0, 0.125], "float16"),
        (
            [q, TensorInfo("float16", (2, 7, 4, 64)), TensorInfo("float16", (2, 7, 4, 64)), q, out],
            [2, 5, 7, 6, 4, 64, 0, 0, 0.125],
            "divide",
        ),
    ]
    for tensors, scalars, match in wrong:
        with pytest.raises(OpError, match=match):
            check(tensors, scalars)
    long_kv = TensorInfo("float16", (2, 20_000, 2, 64))
    with pytest.raises(OpError, match="past"):
        check([q, long_kv, long_kv, TensorInfo("uint8", (2, 20_000)), out], [2, 5, 20_000, 6, 2, 64, 0, 3, 0.125])

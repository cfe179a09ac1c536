"""The dtypes the attention ops take and give, against numpy in float64 on every backend: `embedding` takes
ids of int32, uint32, int64 and uint64 (tokenizers give int64), an id outside 0 .. V-1 giving zeros
whatever its width (WGSL reads a 64-bit id as two words: a high word other than 0 is outside, never
wrapped onto the low word's row); `attention` and `attention_decode` write q's dtype, as torch's SDPA
does, or `out`'s (float32, float16 or bfloat16; others refused by name), through every kernel that
computes them (WebGPU: attention_tiled and the split kernel; CUDA: flash and the split kernel).
bfloat16 q, k and v: test_attention_bf16.py.
"""

from __future__ import annotations

import numpy as np
import pytest

import gpud_client
from gpud_client import InvalidArgument
from gpud_protocol.ops import KERNELS, OpError, TensorInfo
from gpud_protocol.ops.attention_flash import FLASH_HEAD_DIMS
from ops.test_attention import TOL, attention_ref, close, decode_visible, poisoned
from ops.test_attention_mask import FLASH_TOL


@pytest.mark.parametrize("ids_dtype", ["int32", "uint32", "int64", "uint64"])
async def test_embedding_ids_of_every_integer_width(gpu: gpud_client.Client, ids_dtype: str) -> None:
    """Regression: embedding took int32 ids only (a tokenizer's int64 ids needed a cast on the host)."""
    rng = np.random.default_rng()
    vocab, dim = 37, 19
    table = rng.standard_normal((vocab, dim)).astype(np.float32)
    values = [int(i) for i in rng.integers(0, vocab, 18)]
    info = np.iinfo(ids_dtype)
    # past the table, the type's extremes; 64-bit: a high word of 1 over a low word inside the table
    # (2^32 + 3), and a negative id whose low word is inside it (-2^32 + 5: words 5, 0xffffffff)
    edges = [vocab, info.max, info.min, vocab - 1, 0, 2**31, 2**32 + 3, -(2**32) + 5, 2**32 - 1, -1]
    fitting = [e for e in edges if info.min <= e <= info.max]
    values[: len(fitting)] = fitting
    host = np.array(values, dtype=ids_dtype).reshape(3, 6)
    out = poisoned(gpu, (3, 6, dim), "float32")
    got = gpu.ops.embedding(gpu.tensor(host), gpu.tensor(table), out=out)
    assert got is out
    valid = np.array([0 <= i < vocab for i in values]).reshape(3, 6)
    rows = np.array([i if 0 <= i < vocab else 0 for i in values]).reshape(3, 6)
    ref = np.where(valid[..., None], table[rows], 0)
    np.testing.assert_array_equal(await out.numpy(), ref)
    half = gpu.ops.embedding(gpu.tensor(host[1]), gpu.tensor(table.astype(np.float16)), dtype="float16")
    np.testing.assert_array_equal(await half.numpy(), ref[1].astype(np.float16))


async def test_embedding_refuses_ids_of_other_dtypes(gpu: gpud_client.Client) -> None:
    table = gpu.tensor(np.ones((4, 8), np.float32))
    for dtype in (np.float32, np.int16, np.uint8):
        with pytest.raises(InvalidArgument, match="int32, uint32, int64 or uint64") as info:
            gpu.ops.embedding(gpu.tensor(np.zeros(3, dtype)), table)
        assert info.value.op == "embedding"


def flash_runs(gpu: gpud_client.Client, q: np.ndarray, k: np.ndarray) -> bool:
    return gpu.backend == "cuda" and q.dtype == k.dtype == np.float16 and q.shape[-1] in FLASH_HEAD_DIMS


@pytest.mark.parametrize(
    ("q_dtype", "kv_dtype"), [("float16", "float16"), ("float16", "float32"), ("float32", "float16")]
)
async def test_attention_writes_q_dtype_or_out_dtype(gpu: gpud_client.Client, q_dtype: str, kv_dtype: str) -> None:
    """Regression: attention wrote float32 whatever q was, and refused a float16 out (an encoder of float16
    weights needed a cast op after every attention)."""
    rng = np.random.default_rng()
    cases = [  # B, T, S, Hq, Hkv, D: every width of attention_tiled (32, 64, 128, 256), odd D (rows start mid-word)
        (2, 37, 37, 4, 2, 32),
        (1, 20, 17, 2, 2, 64),
        (2, 19, 23, 2, 1, 3),
        (1, 9, 9, 2, 1, 41),
        (1, 17, 21, 2, 1, 100),
        (1, 5, 40, 3, 3, 201),
    ]
    for b, t, s, hq, hkv, d in cases:
        q = rng.standard_normal((b, t, hq, d)).astype(q_dtype)
        k = (rng.standard_normal((b, s, hkv, d)) * 1.5).astype(kv_dtype)
        v = rng.standard_normal((b, s, hkv, d)).astype(kv_dtype)
        keep = np.arange(s)[None, :] < rng.integers(1, s + 1, b)[:, None]
        seen = np.broadcast_to(keep[:, None, :], (b, t, s)) & (
            np.arange(s)[None, None, :] <= np.arange(t)[None, :, None] + (s - t)
        )
        ref = attention_ref(q, k, v, seen)
        qt, kt, vt, km = gpu.tensor(q), gpu.tensor(k), gpu.tensor(v), gpu.tensor(keep.astype(np.int64))
        flash = FLASH_TOL if flash_runs(gpu, q, k) else 0.0  # CUDA's flash kernel takes no `splits`
        for splits in (None, 1):  # the one-pass kernel of the backend, and (WebGPU) the split kernel + combine
            got = gpu.ops.attention(qt, kt, vt, causal=True, key_mask=km, splits=splits)
            assert np.dtype(got.dtype).name == q_dtype
            close(await got.numpy(), ref, max(TOL[q_dtype], flash))
            for out_dtype in ("float32", "float16"):
                out = poisoned(gpu, q.shape, out_dtype)
                assert gpu.ops.attention(qt, kt, vt, causal=True, key_mask=km, splits=splits, out=out) is out
                close(await out.numpy(), ref, max(TOL[out_dtype], flash))


async def test_attention_decode_writes_q_dtype_or_out_dtype(gpu: gpud_client.Client) -> None:
    rng = np.random.default_rng()
    batch, length, hq, hkv, dim = 3, 40, 4, 2, 16
    kc, vc = (rng.standard_normal((batch, length, hkv, dim)).astype(np.float16) for _ in range(2))
    pos = np.array([0, 17, 39], np.int32)
    k, v, p = gpu.tensor(kc), gpu.tensor(vc), gpu.tensor(pos)
    for q_dtype in ("float32", "float16"):
        q = rng.standard_normal((batch, hq, dim)).astype(q_dtype)
        ref = attention_ref(q[:, None], kc, vc, decode_visible(pos, length))[:, 0]
        got = gpu.ops.attention_decode(gpu.tensor(q), k, v, p)
        assert np.dtype(got.dtype).name == q_dtype
        close(await got.numpy(), ref, TOL[q_dtype])
        out = poisoned(gpu, q.shape, "float16")
        gpu.ops.attention_decode(gpu.tensor(q), k, v, p, out=out)
        close(await out.numpy(), ref, TOL["float16"])


async def test_attention_refuses_an_integer_or_misshapen_out_by_name(gpu: gpud_client.Client) -> None:
    x = gpu.tensor(np.ones((2, 3, 4, 32), np.float16))
    pos = gpu.tensor(np.zeros(2, np.int32))
    with pytest.raises(InvalidArgument, match="attention: out is int32") as info:
        gpu.ops.attention(x, x, x, out=gpu.empty((2, 3, 4, 32), "int32"))
    assert info.value.op == "attention"
    with pytest.raises(InvalidArgument, match="float32, float16 or bfloat16"):
        gpu.ops.attention(x, x, x, splits=1, out=gpu.empty((2, 3, 4, 32), "uint16"))
    with pytest.raises(InvalidArgument, match="attention_decode: out is"):
        gpu.ops.attention_decode(
            gpu.tensor(np.ones((2, 4, 32), np.float16)), x, x, pos, out=gpu.empty((2, 4, 32), "int32")
        )
    with pytest.raises(InvalidArgument, match=r"out is float16\[2, 3, 4, 8\]"):
        gpu.ops.attention(x, x, x, out=gpu.empty((2, 3, 4, 8), "float16"))


def test_the_rules_of_the_float16_outputs() -> None:
    """Every kernel that writes attention's output has a float16 twin, checked like the float32 one."""
    q, kv = TensorInfo("float16", (2, 5, 6, 64)), TensorInfo("float16", (2, 7, 2, 64))
    for out_dtype, short in (("float32", "f32"), ("float16", "f16")):
        out = TensorInfo(out_dtype, (2, 5, 6, 64))
        for name in (f"attention_flash_d64_{short}", f"attention_tiled_d64_f16_f16_{short}"):
            KERNELS[name].check([q, kv, kv, q, out], [2, 5, 7, 6, 2, 64, 0, 0, 0.125])
            other = TensorInfo("float16" if out_dtype == "float32" else "float32", out.shape)
            with pytest.raises(OpError, match="out is"):
                KERNELS[name].check([q, kv, kv, q, other], [2, 5, 7, 6, 2, 64, 0, 0, 0.125])
        part = TensorInfo("float32", (2, 5, 6, 3, 66))
        KERNELS[f"attention_combine_{short}"].check([part, out], [out.size, 64, 3])
    check = KERNELS["embedding_f32_f16"].check
    table, out = TensorInfo("float32", (10, 4)), TensorInfo("float16", (3, 4))
    for mode, dtype in enumerate(("int32", "uint32", "int64", "uint64")):
        check([TensorInfo(dtype, (3,)), table, out], [12, 4, 10, mode])
        with pytest.raises(OpError, match="ids"):
            check([TensorInfo(dtype, (3,)), table, out], [12, 4, 10, (mode + 1) % 4])

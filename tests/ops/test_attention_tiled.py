"""attention_tiled, WebGPU's one-pass full attention (blocks of query rows sharing tiles of keys), against
numpy in float64: every head-dim width (1, 2, 4 or 8 threads per row) and dims that fill none, float32
and float16, grouped heads, causal with T = S, T < S and T > S, additive masks, key masks, rows that
see nothing; the longest sequence lavapipe's loop budget allows, and the split kernel past it; the
kernel's rule (no device). Hidden keys hold NaN: they must never be read. On a software adapter
(lavapipe) the client sends D 32 and 64 without an additive mask to attention_cpu (test_attention_cpu.py):
there `tiled` dispatches attention_tiled itself, which GPUs run.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import gpud_client
from gpud_client import InvalidArgument, u32
from gpud_client.dtypes import dtype_name
from gpud_protocol.ops import KERNELS, OpError, TensorInfo
from gpud_protocol.ops.attention import MAX_LOOP, SHORT
from gpud_protocol.ops.attention_tiled import (
    TILED_HEAD_DIMS,
    tiled_applies,
    tiled_grid,
    tiled_keys,
    tiled_loop,
    tiled_width,
)
from ops.test_attention import TOL, attention_ref, close, poisoned


def webgpu_only(gpu: gpud_client.Client) -> None:
    if gpu.backend != "webgpu":
        pytest.skip("attention_tiled is WebGPU's")


def software(gpu: gpud_client.Client) -> bool:
    """A WebGPU adapter on the CPU (lavapipe), where the client picks attention_cpu where it can."""
    return gpu.backend == "webgpu" and bool(gpu.devices[gpu.device].get("software"))


def tiled(
    gpu: gpud_client.Client, q: Any, k: Any, v: Any, *, causal: bool = False, key_mask: Any = None, out: Any = None
) -> Any:
    """attention_tiled itself (q, k, v tensors; no additive mask), whichever kernel gpu.ops.attention picks."""
    dtypes = "_".join(SHORT[dtype_name(t)] for t in (q, k, q if out is None else out))
    name = f"attention_tiled_d{tiled_width(int(q.shape[-1]))}_{dtypes}"
    grid = tiled_grid(*(int(n) for n in q.shape))
    return gpu.ops._one_pass(name, grid, q, k, v, key_mask, causal, None, out, None)


def kernels(gpu: gpud_client.Client, prefix: str) -> set[str]:
    return {name for name in gpu.ops._kernels if name.startswith(prefix)}


def longest(width: int) -> int:
    """The most keys attention_tiled_d<width> takes."""
    keys = tiled_keys(width)
    while tiled_loop(keys + tiled_keys(width), width) <= MAX_LOOP:
        keys += tiled_keys(width)
    return keys


async def test_full_attention_on_webgpu_is_one_pass_of_the_tiled_kernel(gpu: gpud_client.Client) -> None:
    """Regression: at an encoder's 62 keys, full attention ran one 256-thread workgroup per query row (most
    threads idle) plus a combine pass. Now one dispatch of attention_tiled; `splits=` still picks the split
    kernel, with the same result."""
    webgpu_only(gpu)
    rng = np.random.default_rng()
    b, t, h, d = 3, 62, 4, 32
    q, k, v = (rng.standard_normal((b, t, h, d)).astype(np.float32) for _ in range(3))
    keep = np.arange(t)[None, :] < np.array([0, 40, 62])[:, None]  # the first sentence is empty
    k[~keep], v[~keep] = np.nan, np.nan
    ref = attention_ref(q, np.nan_to_num(k), np.nan_to_num(v), np.broadcast_to(keep[:, None, :], (b, t, t)))
    qt, kt, vt, mask = gpu.tensor(q), gpu.tensor(k), gpu.tensor(v), gpu.tensor(keep.astype(np.float32))
    got = await gpu.ops.attention(qt, kt, vt, key_mask=mask).numpy()
    close(got, ref, TOL["float32"])
    np.testing.assert_array_equal(got[0], 0)
    one_pass = {"attention_cpu_d32_f32_f32_f32" if software(gpu) else "attention_tiled_d32_f32_f32_f32"}
    assert set(gpu.ops._kernels) == one_pass
    if software(gpu):  # attention_tiled, which GPUs run, on the same call
        close(await tiled(gpu, qt, kt, vt, key_mask=mask).numpy(), ref, TOL["float32"])
        one_pass.add("attention_tiled_d32_f32_f32_f32")
    split = await gpu.ops.attention(qt, kt, vt, key_mask=mask, splits=1).numpy()
    close(split, ref, TOL["float32"])
    assert set(gpu.ops._kernels) == {*one_pass, "attention_f32_f32", "attention_combine_f32"}


@pytest.mark.parametrize(
    ("q_dtype", "kv_dtype"), [("float32", "float32"), ("float16", "float16"), ("float32", "float16")]
)
async def test_every_width_and_mask_kind(gpu: gpud_client.Client, q_dtype: str, kv_dtype: str) -> None:
    webgpu_only(gpu)
    rng = np.random.default_rng()
    cases = [  # B, T, S, Hq, Hkv, D
        (2, 70, 70, 2, 1, 32),  # two blocks of rows, three tiles of keys
        (2, 33, 50, 4, 2, 64),
        (1, 20, 17, 2, 2, 128),  # T > S: the first rows see nothing when causal
        (1, 9, 9, 2, 1, 256),
        (2, 19, 23, 2, 2, 3),  # D not a multiple of 4
        (1, 17, 21, 2, 1, 100),
        (1, 5, 40, 3, 3, 200),
    ]
    for batch, steps, keys, hq, hkv, dim in cases:
        q = rng.standard_normal((batch, steps, hq, dim)).astype(q_dtype)
        k = (rng.standard_normal((batch, keys, hkv, dim)) * 2).astype(kv_dtype)
        v = rng.standard_normal((batch, keys, hkv, dim)).astype(kv_dtype)
        keep = rng.random((batch, keys)) < 0.7
        keep[-1, -1] = True
        k[~keep], v[~keep] = np.nan, np.nan  # hidden by the key mask: never read
        kn, vn = np.nan_to_num(k), np.nan_to_num(v)
        qt, kt, vt = gpu.tensor(q), gpu.tensor(k), gpu.tensor(v)
        causal = np.arange(keys)[None, None, :] <= np.arange(steps)[None, :, None] + (keys - steps)
        key_seen = np.broadcast_to(keep[:, None, :], (batch, steps, keys))
        additive = (rng.standard_normal((batch, 1, steps, keys)) * 3).astype(np.float32)
        additive[:, :, :, :2] = -np.inf
        additive[~np.broadcast_to(keep[:, None, None, :], additive.shape)] = -np.inf
        for is_causal, key_mask, mask, seen in [
            (False, keep.astype(np.int64), None, key_seen),
            (True, keep.astype(np.uint8), None, key_seen & causal),
            (True, None, additive, np.broadcast_to(causal, key_seen.shape)),
        ]:
            out = poisoned(gpu, (batch, steps, hq, dim), "float32")
            km = None if key_mask is None else gpu.tensor(key_mask)
            m = None if mask is None else gpu.tensor(mask)
            gpu.ops.attention(qt, kt, vt, causal=is_causal, key_mask=km, mask=m, out=out)
            close(await out.numpy(), attention_ref(q, kn, vn, seen, mask), TOL["float32"])
    widths = {int(name.split("_")[2][1:]) for name in kernels(gpu, "attention_tiled_")}
    assert widths == set(TILED_HEAD_DIMS)
    assert not kernels(gpu, "attention_combine")


@pytest.mark.parametrize("width", TILED_HEAD_DIMS)
async def test_the_longest_sequence_within_the_loop_budget(gpu: gpud_client.Client, width: int) -> None:
    """Lavapipe cuts a loop nest after 65,535 iterations, silently: at the most keys the rule allows, a
    key at the very end must still count; one tile more goes to the split kernel."""
    webgpu_only(gpu)
    rng = np.random.default_rng(width)
    keys = longest(width)
    q = rng.standard_normal((1, 16, 1, width)).astype(np.float32)
    # |q|^2 = D for the last row, so the peak's score is 4 sqrt(D) whatever the draw: it dominates the
    # ~28,000 other keys (an unlucky small |q| once let them take a fifth of the weight)
    q[0, -1, 0] *= np.sqrt(width) / np.linalg.norm(q[0, -1, 0])
    k = (rng.standard_normal((1, keys + tiled_keys(width), 1, width)) * 0.1).astype(np.float16)
    v = rng.standard_normal(k.shape).astype(np.float16)
    k[0, keys - 1, 0] = (q[0, -1, 0] * 4).astype(np.float16)  # the last row's peak: the last key it sees
    for count, used in [
        (keys, {f"attention_tiled_d{width}_f32_f16_f32"}),
        (keys + tiled_keys(width), {"attention_f32_f16"}),  # the client's choice past the tiled budget
    ]:
        qkv = (gpu.tensor(q), gpu.tensor(k[:, :count]), gpu.tensor(v[:, :count]))
        got = await (tiled(gpu, *qkv) if count == keys else gpu.ops.attention(*qkv)).numpy()
        ref = attention_ref(q, k[:, :count], v[:, :count], np.ones((1, 16, count), bool))
        close(got, ref, TOL["float32"])
        assert np.abs(ref[0, -1, 0] - v[0, keys - 1, 0]).max() < 0.05  # the peak dominates: it was read
        assert used <= set(gpu.ops._kernels), used
    assert kernels(gpu, "attention_tiled_") == {f"attention_tiled_d{width}_f32_f16_f32"}


async def test_the_daemon_checks_a_tiled_dispatch_too(gpu: gpud_client.Client) -> None:
    """A client that skips the library's checks: the daemon applies the tiled kernel's rule."""
    webgpu_only(gpu)
    x = gpu.tensor(np.ones((2, 3, 4, 32), np.float32))
    out = gpu.empty((2, 3, 4, 32), "float32")
    kernel = gpu.ops._kernel("attention_tiled_d32_f32_f32_f32")
    sizes = [u32(n) for n in (2, 3, 3, 4, 3, 32, 0, 0)]  # 3 KV heads claimed
    gpu.dispatch(kernel, (1, 4, 2), [x, x, x, x, out, *sizes, 0.5])
    with pytest.raises(InvalidArgument, match="attention_tiled_d32_f32_f32_f32"):
        await out.numpy()


def test_the_tiled_rule_itself() -> None:
    """What the client and the daemon check before attention_tiled runs, and when the client picks it."""
    check = KERNELS["attention_tiled_d64_f16_f32_f32"].check
    q, kv = TensorInfo("float16", (2, 5, 6, 40)), TensorInfo("float32", (2, 7, 2, 40))
    out, key_mask, additive = (
        TensorInfo("float32", (2, 5, 6, 40)),
        TensorInfo("int64", (2, 7)),
        TensorInfo("float32", (2, 1, 5, 7)),
    )
    check([q, kv, kv, key_mask, out], [2, 5, 7, 6, 2, 40, 1, 6, 0.125])
    check([q, kv, kv, additive, out], [2, 5, 7, 6, 2, 40, 0, 2, 0.125])
    check([q, kv, kv, q, out], [2, 5, 7, 6, 2, 40, 0, 0, 0.125])  # no mask: q stands in, unread
    long_kv = TensorInfo("float32", (2, 40_000, 2, 40))
    wrong = [
        ([q, kv, kv, key_mask, out], [2, 5, 7, 6, 2, 40, 1, 4, 0.125], "mask mode passed"),  # int64 is 6
        ([q, kv, kv, additive, out], [2, 5, 7, 6, 2, 40, 0, 1, 0.125], "mask mode passed"),  # (B, 1, T, S) is 2
        ([q, kv, kv, q, out], [2, 5, 7, 6, 2, 40, 0, 7, 0.125], "unknown mask mode"),
        ([q, kv, kv, q, TensorInfo("float16", (2, 5, 6, 40))], [2, 5, 7, 6, 2, 40, 0, 0, 0.125], "out is"),
        ([q, kv, kv, q, out], [2, 5, 7, 6, 3, 40, 0, 0, 0.125], "sizes"),
        ([TensorInfo("float32", (2, 5, 6, 40)), kv, kv, q, out], [2, 5, 7, 6, 2, 40, 0, 0, 0.125], "q is float32"),
        ([q, TensorInfo("float16", (2, 7, 2, 40)), kv, q, out], [2, 5, 7, 6, 2, 40, 0, 0, 0.125], "k and v"),
        ([q, kv, kv, q, out], [2, 5, 7, 6, 2, 40, 2, 0, 0.125], "causal"),
        ([q, long_kv, long_kv, q, out], [2, 5, 40_000, 6, 2, 40, 0, 0, 0.125], "loop budget"),
    ]
    for tensors, scalars, match in wrong:
        with pytest.raises(OpError, match=match):
            check(tensors, scalars)
    wide_q, wide_out = TensorInfo("float16", (2, 5, 6, 65)), TensorInfo("float32", (2, 5, 6, 65))
    wide_kv = TensorInfo("float32", (2, 7, 2, 65))
    with pytest.raises(OpError, match="past 64"):
        check([wide_q, wide_kv, wide_kv, q, wide_out], [2, 5, 7, 6, 2, 65, 0, 0, 0.125])

    assert tiled_grid(3, 62, 12, 32) == (1, 12, 3)  # 64 rows of 32 dims per workgroup
    assert tiled_grid(3, 62, 12, 64) == (2, 12, 3)  # 32 rows of 64
    assert tiled_grid(1, 17, 2, 256) == (3, 2, 1)  # 8 rows of 256

    def applies(q_shape: tuple[int, ...], keys: int, dtype: str = "float32") -> bool:
        k_shape = (q_shape[0], keys, 1, q_shape[-1])
        return tiled_applies(TensorInfo(dtype, q_shape), TensorInfo(dtype, k_shape), dtype)

    assert applies((16, 62, 12, 32), 62) and applies((1, 1, 2, 64), 62)
    assert applies((1, 16, 2, 256), longest(256)) and not applies((1, 16, 2, 256), longest(256) + 1)
    assert not applies((1, 8, 2, 64), 5000)  # a few rows over many keys: the split kernel spreads them
    assert not applies((1, 64, 2, 257), 64)  # past the widest entry point
    assert not applies((1, 64, 2, 32), 64, "int32")
    assert not applies((70_000, 64, 1, 32), 64)  # past WebGPU's 65,535 workgroups in z

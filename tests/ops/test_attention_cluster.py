"""Attention whose splits merge in a cluster (attention_s<S>, one launch on CUDA): the bits of the split
kernel then attention_combine at every split count a cluster takes, for decode against a cache (GQA,
positions at tile edges, NaN past them), a causal full attention and a key mask; against numpy in
float64. Elsewhere the op runs the two kernels, and these tests check that path against itself."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import gpud_client
from ops.test_attention import TOL, attention_ref, close, decode_visible


async def both_ways(gpu: gpud_client.Client, run: Callable[[], Any]) -> tuple[np.ndarray, np.ndarray, str | None]:
    """`run()`'s output with the clusters the device offers, and with the split kernels and their combine;
    the kernel of the first (None: the two)."""
    ops: Any = gpu.ops
    ops._plans.clear()
    clustered = await run().numpy()
    plans = [p for p in ops._plans.values() if type(p).__name__ == "SplitPlan"]
    kernel = plans[-1].first.name if plans and plans[-1].combine is None else None
    ops._clusters = lambda _like, _splits: False
    ops._plans.clear()
    try:
        split = await run().numpy()
    finally:
        del ops._clusters
        ops._plans.clear()
    return clustered, split, kernel


@pytest.mark.parametrize(
    ("q_dtype", "kv_dtype"), [("float32", "float16"), ("float32", "float32"), ("bfloat16", "bfloat16")]
)
@pytest.mark.parametrize("splits", [1, 2, 4, 8])
async def test_decode_in_one_launch_has_the_bits_of_split_and_combine(
    gpu: gpud_client.Client, splits: int, q_dtype: str, kv_dtype: str
) -> None:
    rng = np.random.default_rng(splits)
    batch, length, hq, hkv, dim = 3, 1024, 14, 2, 64  # a decode step's heads: 14 sharing 2
    q = rng.standard_normal((batch, hq, dim)).astype(np.float32)
    kc = (rng.standard_normal((batch, length, hkv, dim)) * 2).astype(np.float32)
    vc = rng.standard_normal((batch, length, hkv, dim)).astype(np.float32)
    pos = np.array([0, 255, 700], np.int32)  # one key, a tile's last, a split past the first
    for b, p in enumerate(pos):
        kc[b, p + 1 :] = np.nan
        vc[b, p + 1 :] = np.nan
    qt = gpu.tensor(q, dtype=q_dtype)
    k, v, p = gpu.tensor(kc, dtype=kv_dtype), gpu.tensor(vc, dtype=kv_dtype), gpu.tensor(pos)
    clustered, split, kernel = await both_ways(gpu, lambda: gpu.ops.attention_decode(qt, k, v, p, splits=splits))
    if gpu.backend == "cuda":
        assert kernel is not None and kernel.startswith(f"attention_s{splits}_")
    np.testing.assert_array_equal(clustered, split)
    ref = attention_ref(
        np.asarray(await qt.numpy(), np.float64)[:, None], await k.numpy(), await v.numpy(), decode_visible(pos, length)
    )
    close(np.asarray(clustered, np.float64), ref[:, 0], 1e-5 if q_dtype == "float32" else 8e-3)


@pytest.mark.parametrize("splits", [2, 8])
async def test_causal_attention_and_a_key_mask_in_one_launch(gpu: gpud_client.Client, splits: int) -> None:
    rng = np.random.default_rng(11)
    b, t, h, d = 2, 5, 4, 32
    q = rng.standard_normal((b, t, h, d)).astype(np.float32)
    kv = [rng.standard_normal((b, 600, 2, d)).astype(np.float32) for _ in range(2)]
    qt, k, v = gpu.tensor(q), gpu.tensor(kv[0]), gpu.tensor(kv[1])
    clustered, split, _ = await both_ways(gpu, lambda: gpu.ops.attention(qt, k, v, causal=True, splits=splits))
    np.testing.assert_array_equal(clustered, split)
    visible = np.arange(600)[None, None, :] <= np.arange(t)[None, :, None] + 600 - t
    close(clustered, attention_ref(q, kv[0], kv[1], np.broadcast_to(visible, (b, t, 600))), TOL["float32"])
    keys = np.ones((b, 600), np.int64)
    keys[0, 300:] = 0
    keys[1, :10] = 0
    m = gpu.tensor(keys)
    clustered, split, _ = await both_ways(gpu, lambda: gpu.ops.attention(qt, k, v, key_mask=m, splits=splits))
    np.testing.assert_array_equal(clustered, split)
    shown = np.broadcast_to(keys[:, None, :] != 0, (b, t, 600))
    close(clustered, attention_ref(q, kv[0], kv[1], shown), TOL["float32"])


def test_the_choice_and_the_rule() -> None:
    """Which kernel merges in a cluster, pure; its rule: attention's, with out for part and its splits."""
    from gpud_protocol.ops import KERNELS, MAX_GROUPS, OpError, TensorInfo
    from gpud_protocol.ops.attention_cluster import cluster_grid, cluster_kernel

    assert cluster_kernel(4, 14, "float32", "float16", "float32") == "attention_s4_f32_f16"
    assert cluster_kernel(3, 14, "float32", "float16", "float32") is None  # no cluster of 3
    assert cluster_kernel(4, 14, "float32", "float16", "float16") is None  # another dtype out: the combine's
    assert cluster_kernel(8, MAX_GROUPS // 8 + 1, "float32", "float32", "float32") is None
    assert cluster_grid(14, 4) == (56, 1, 1)
    rule = KERNELS["attention_s2_f32_f16"].check
    q, kv = TensorInfo("float32", (1, 14, 64)), TensorInfo("float16", (1, 512, 2, 64))
    pos = TensorInfo("int32", (1,))
    scalars = [1, 1, 512, 14, 2, 64, 2, 0, 0, 1, 0.125]
    rule([q, kv, kv, pos, q, q], scalars)
    with pytest.raises(OpError, match="splits is 2"):
        rule([q, kv, kv, pos, q, q], [*scalars[:6], 4, *scalars[7:]])
    with pytest.raises(OpError, match="out is float16"):
        rule([q, kv, kv, pos, q, TensorInfo("float16", (1, 14, 64))], scalars)

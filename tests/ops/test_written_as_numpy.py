"""A transformer block written as a numpy or torch user writes one, without the fused ops: 4-D matmuls
with a transposed key, a causal mask through `where` and a number, a layer norm by hand with kept
axes, GELU, residuals; against the same code in numpy float64 (the op surface's numpy semantics
together, on every backend)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

import gpud_client

B, S, H, D = 2, 7, 3, 8  # batch, sequence, heads, head size
E = H * D


def block(ops: Any, x: Any, weights: list[Any], causal: Any, neg: Any) -> Any:
    """One pre-norm attention block; `ops` is gpu.ops, or numpy in its clothes (`NumpyOps`)."""
    wq, wk, wv, wo = weights
    mean = ops.mean(x, axis=-1, keepdims=True)
    centred = ops.sub(x, mean)
    var = ops.mean(ops.mul(centred, centred), axis=-1, keepdims=True)
    normed = ops.mul(centred, ops.rsqrt(ops.add(var, 1e-5)))
    q, k, v = (ops.matmul(normed, w).reshape(B, S, H, D).transpose(1, 2) for w in (wq, wk, wv))
    scores = ops.mul(ops.matmul(ops.contiguous(q), ops.contiguous(k).transpose(-1, -2)), 1 / np.sqrt(D))
    scores = ops.where(causal, scores, neg)
    attn = ops.matmul(ops.softmax(scores, axis=-1), ops.contiguous(v))
    merged = ops.contiguous(attn.transpose(1, 2)).reshape(B, S, E)
    return ops.add(x, ops.gelu(ops.matmul(merged, wo)))


class Torchish(np.ndarray[Any, Any]):
    """numpy float64 with torch's transpose(dim0, dim1), as gpud's tensors have it."""

    def transpose(self, *dims: Any) -> Any:
        return np.swapaxes(self, *dims) if len(dims) == 2 else super().transpose(*dims)


def torchish(a: Any) -> Torchish:
    return np.asarray(a, np.float64).view(Torchish)


class NumpyOps:
    """numpy float64 under gpu.ops's names: what the block computes, to compare with."""

    sub, mul, add, where = np.subtract, np.multiply, np.add, np.where
    mean = staticmethod(lambda x, axis, keepdims: x.mean(axis=axis, keepdims=keepdims))
    rsqrt = staticmethod(lambda x: 1 / np.sqrt(x))
    matmul = staticmethod(lambda a, b: torchish(np.matmul(a, b)))
    contiguous = staticmethod(lambda a: torchish(np.ascontiguousarray(a)))
    gelu = staticmethod(lambda x: x * 0.5 * (1 + np.vectorize(math.erf)(x / math.sqrt(2))))

    @staticmethod
    def softmax(x: np.ndarray[Any, Any], axis: int) -> np.ndarray[Any, Any]:
        e = np.exp(x - x.max(axis=axis, keepdims=True))
        return e / e.sum(axis=axis, keepdims=True)  # type: ignore[no-any-return]


async def test_a_block_written_as_numpy_users_write_it(gpu: gpud_client.Client) -> None:
    rng = np.random.default_rng()
    x = rng.standard_normal((B, S, E)).astype(np.float32)
    ws = [(rng.standard_normal((E, E)) / np.sqrt(E)).astype(np.float32) for _ in range(4)]
    causal = np.tril(np.ones((S, S), bool))
    async with gpu.scope() as scope:
        got_t = block(gpu.ops, gpu.tensor(x), [gpu.tensor(w) for w in ws], gpu.tensor(causal), -np.inf)
        got = await scope.keep(got_t).numpy()

    want = block(NumpyOps, torchish(x), [torchish(w) for w in ws], causal, -np.inf)
    np.testing.assert_allclose(got, np.asarray(want), rtol=1e-4, atol=1e-4)

"""The BERT sentence encoder of `gpud.testing.bert` in numpy float64: the same model, written plainly.

Checked against sentence-transformers' own all-MiniLM-L6-v2 embeddings once, when the stored ones were
made (scripts/embed-reference.py); the tests check gpud's encoder against it on a tiny random BERT.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from gpud.testing.bert import BertConfig, layer_prefix

Array = np.ndarray[Any, Any]
EMBEDDING_TOL = 1e-4  # max |gpud - reference| per element of a unit embedding, float32 weights (measured ~1e-7)


def _erf(x: Array) -> Array:
    out: Array = np.vectorize(math.erf, otypes=[np.float64])(x)
    return out


def _layernorm(x: Array, weight: Array, bias: Array, eps: float) -> Array:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    out: Array = (x - mean) / np.sqrt(var + eps) * weight + bias
    return out


def _linear(x: Array, w: Mapping[str, Array], name: str) -> Array:
    return x @ w[name + ".weight"].T + w[name + ".bias"]


def reference_embeddings(config: BertConfig, weights: Mapping[str, Array], ids: Array, mask: Array) -> Array:
    """(B, hidden) float64 unit embeddings of `ids` (B, S) with `mask` (B, S) (nonzero: a real token)."""
    c = config
    w = {name: np.asarray(value, np.float64) for name, value in weights.items()}
    ids = np.asarray(ids)
    keep = np.asarray(mask) != 0
    batch, length = ids.shape
    x = (
        w["embeddings.word_embeddings.weight"][ids]
        + w["embeddings.position_embeddings.weight"][:length]
        + w["embeddings.token_type_embeddings.weight"][0]
    )
    x = _layernorm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], c.eps)
    hidden_mask = np.where(keep, 0.0, -np.inf)[:, None, None, :]  # (B, 1, 1, S): padding keys hidden
    for i in range(c.layers):
        p = layer_prefix(i)

        def heads(t: Array) -> Array:
            return t.reshape(batch, length, c.heads, c.head_dim).transpose(0, 2, 1, 3)  # (B, heads, S, D)

        q = heads(_linear(x, w, p + "attention.self.query"))
        k = heads(_linear(x, w, p + "attention.self.key"))
        v = heads(_linear(x, w, p + "attention.self.value"))
        scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(c.head_dim) + hidden_mask
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        attn = (scores / scores.sum(-1, keepdims=True)) @ v
        attn = attn.transpose(0, 2, 1, 3).reshape(batch, length, c.hidden)
        x = _layernorm(
            x + _linear(attn, w, p + "attention.output.dense"),
            w[p + "attention.output.LayerNorm.weight"],
            w[p + "attention.output.LayerNorm.bias"],
            c.eps,
        )
        h = _linear(x, w, p + "intermediate.dense")
        h = 0.5 * h * (1.0 + _erf(h / math.sqrt(2.0)))  # exact GELU
        x = _layernorm(
            x + _linear(h, w, p + "output.dense"),
            w[p + "output.LayerNorm.weight"],
            w[p + "output.LayerNorm.bias"],
            c.eps,
        )
    weights_ = keep.astype(np.float64)[:, :, None]
    pooled = (x * weights_).sum(1) / weights_.sum(1)
    out: Array = pooled / np.maximum(np.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12)
    return out

"""The decode model of `gpud.testing.transformer` in numpy float64, and the checks against it.

The weights are the same float16 values (widened); the KV caches hold float16, as the daemon's do.
`reference_logits` feeds the tokens a run chose (teacher forcing), so one near tie does not send the
two down different paths; `greedy_mismatch` says where a chosen token is not the reference's argmax.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from gpud.testing.transformer_weights import Config


class Reference:
    """The same model in numpy float64 (weights as float16 values), one sequence, token by token."""

    def __init__(self, config: Config, params: dict[str, np.ndarray[Any, Any]]) -> None:
        self.c = config
        self.w = {name: value.astype(np.float64) for name, value in params.items()}
        self.k: list[list[np.ndarray[Any, Any]]] = [[] for _ in range(config.layers)]
        self.v: list[list[np.ndarray[Any, Any]]] = [[] for _ in range(config.layers)]

    def step(self, token: int) -> np.ndarray[Any, Any]:
        """The logits after `token` at the next position."""
        c, w = self.c, self.w
        pos = len(self.k[0])
        x = w["embed"][token].copy()
        for i in range(c.layers):
            p = f"layer{i}."
            h = _rmsnorm(x, w[p + "norm1"], c.eps)
            qkv = w[p + "qkv"] @ h + w[p + "qkv_bias"]  # q, k and v stacked
            q = qkv[: c.heads * c.head_dim].reshape(c.heads, c.head_dim)
            k = qkv[c.heads * c.head_dim : c.heads * c.head_dim + c.kv_width].reshape(c.kv_heads, c.head_dim)
            v = qkv[c.heads * c.head_dim + c.kv_width :].reshape(c.kv_heads, c.head_dim)
            q, k = _rotate(q, pos, c.rope_base), _rotate(k, pos, c.rope_base)
            # the daemon's caches hold float16: so does the reference
            self.k[i].append(k.astype(np.float16).astype(np.float64))
            self.v[i].append(v.astype(np.float16).astype(np.float64))
            keys, values = np.stack(self.k[i]), np.stack(self.v[i])  # (S, Hkv, D)
            group = c.heads // c.kv_heads
            out = np.empty((c.heads, c.head_dim))
            for head in range(c.heads):
                scores = keys[:, head // group] @ q[head] / math.sqrt(c.head_dim)
                weights_ = np.exp(scores - scores.max())
                out[head] = weights_ @ values[:, head // group] / weights_.sum()
            x = x + w[p + "o"] @ out.reshape(-1)
            h = _rmsnorm(x, w[p + "norm2"], c.eps)
            gate, up = np.split(w[p + "gate_up"] @ h, 2)  # gate and up stacked
            x = x + w[p + "down"] @ (gate / (1 + np.exp(-gate)) * up)
        logits: np.ndarray[Any, Any] = w["embed"] @ _rmsnorm(x, w["norm"], c.eps)
        return logits


def _rmsnorm(x: np.ndarray[Any, Any], weight_: np.ndarray[Any, Any], eps: float) -> np.ndarray[Any, Any]:
    result: np.ndarray[Any, Any] = x / np.sqrt(np.mean(x * x) + eps) * weight_
    return result


def _rotate(x: np.ndarray[Any, Any], pos: int, base: float) -> np.ndarray[Any, Any]:
    """Rotary embedding, the "neox" pairing (j, j + D/2) of Qwen and Llama."""
    half = x.shape[-1] // 2
    angle = pos * base ** (-np.arange(half) * 2.0 / x.shape[-1])
    cos, sin = np.cos(angle), np.sin(angle)
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


LOGIT_TOL = 1e-4  # of the largest |logit| of the step (measured: about 1e-6, float32 against float64)


def reference_logits(
    config: Config, params: dict[str, np.ndarray[Any, Any]], prompt: Sequence[int], chosen: Sequence[int]
) -> list[np.ndarray[Any, Any]]:
    """The reference's logits at every step of one sequence fed `prompt`, then the tokens a run chose
    (teacher forcing: one near tie does not send the two runs down different paths)."""
    ref = Reference(config, params)
    fed = [*prompt, *chosen][: len(prompt) - 1 + len(chosen)]
    return [ref.step(int(token)) for token in fed]


def greedy_mismatch(chosen: Sequence[int], logits: Sequence[np.ndarray[Any, Any]]) -> str:
    """Why `chosen` is not the reference's greedy choice at every step ("" when it is): each token must
    be the argmax of the reference's logits, or within LOGIT_TOL of it where the top two nearly tie."""
    for step, (token, step_logits) in enumerate(zip(chosen, logits, strict=True)):
        best = int(np.argmax(step_logits))
        gap = float(step_logits[best] - step_logits[token])
        if token != best and gap > LOGIT_TOL * float(np.max(np.abs(step_logits))):
            return f"token {step}: {token} where the reference's argmax is {best} ({gap:.3g} higher)"
    return ""

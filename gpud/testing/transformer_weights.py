"""The decoder's configurations and weights (gpud.testing.transformer): float16, drawn from a seed, the
same in every process; uploaded and published once, opened by every other session."""

from __future__ import annotations

import dataclasses
import math
import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np

import gpud_client


@dataclasses.dataclass(frozen=True)
class Config:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    max_len: int  # positions the KV caches hold
    eps: float = 1e-6
    rope_base: float = 1e6

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def qkv_width(self) -> int:
        """Rows of the stacked q, k and v projections."""
        return (self.heads + 2 * self.kv_heads) * self.head_dim

    def parameters(self) -> int:
        return sum(math.prod(shape) for _name, shape in weight_shapes(self))


CONFIGS = {
    "qwen2.5-0.5b": Config(24, 896, 14, 2, 64, 4864, 32_768, 1024),  # the vocabulary cut to 32K
    "small": Config(4, 256, 8, 2, 32, 704, 4096, 128),
    "tiny": Config(2, 64, 4, 2, 16, 128, 256, 32),
}


def weight_shapes(config: Config) -> Iterator[tuple[str, tuple[int, ...]]]:
    """Every weight's name and shape; matrices are (out, in), as a Linear layer stores them."""
    c = config
    yield "embed", (c.vocab, c.hidden)
    for i in range(c.layers):
        p = f"layer{i}."
        yield p + "norm1", (c.hidden,)
        yield p + "qkv", (c.qkv_width, c.hidden)
        yield p + "qkv_bias", (c.qkv_width,)
        yield p + "o", (c.hidden, c.heads * c.head_dim)
        yield p + "norm2", (c.hidden,)
        yield p + "gate_up", (2 * c.intermediate, c.hidden)
        yield p + "down", (c.hidden, c.intermediate)
    yield "norm", (c.hidden,)


# The stacked weights, as one matmul each takes them (gpu.ops.rotary_kv_append and silu_and_mul split the
# result): the parts, each drawn as a weight of its own.
STACKED = {"qkv": ("q", "k", "v"), "qkv_bias": ("q_bias", "k_bias", "v_bias"), "gate_up": ("gate", "up")}


def weight(name: str, shape: tuple[int, ...], seed: int) -> np.ndarray[Any, Any]:
    """One weight, float16, the same in every process for (name, seed)."""
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    if name.endswith("norm1") or name.endswith("norm2") or name == "norm":
        values = 1.0 + 0.1 * rng.standard_normal(shape, np.float32)
    elif name.endswith("_bias"):
        values = 0.1 * rng.standard_normal(shape, np.float32)
    elif name == "embed":  # small, as trained ones are: the layers, not the echo of the input, pick the token
        values = 0.02 * rng.standard_normal(shape, np.float32)
    else:
        values = rng.standard_normal(shape, np.float32) / np.float32(math.sqrt(shape[1]))
    return values.astype(np.float16)


def stacked_weight(config: Config, name: str, shape: tuple[int, ...], seed: int) -> np.ndarray[Any, Any]:
    """Weight `name` of `weight_shapes`: a stacked one (STACKED) is its parts, each drawn by its own name."""
    prefix, _, kind = name.rpartition(".")
    if kind not in STACKED:
        return weight(name, shape, seed)
    q, kv, ffn = config.heads * config.head_dim, config.kv_width, config.intermediate
    rows = (q, kv, kv) if kind.startswith("qkv") else (ffn, ffn)
    parts = zip(STACKED[kind], rows, strict=True)
    return np.concatenate([weight(f"{prefix}.{part}", (n, *shape[1:]), seed) for part, n in parts])


def weights(config: Config, seed: int) -> dict[str, np.ndarray[Any, Any]]:
    return {name: stacked_weight(config, name, shape, seed) for name, shape in weight_shapes(config)}


class Weights:
    """The model's weights on the daemon: uploaded and published once, opened by every other session."""

    def __init__(self, tensors: dict[str, gpud_client.Tensor]) -> None:
        self.t = tensors

    def __getitem__(self, name: str) -> gpud_client.Tensor:
        return self.t[name]

    @staticmethod
    def names(config: Config, prefix: str) -> list[str]:
        return [prefix + name for name, _shape in weight_shapes(config)]

    @classmethod
    async def publish(
        cls, gpu: gpud_client.Client, config: Config, seed: int, prefix: str, device: int | None = None
    ) -> Weights:
        """Upload every weight (generated from `seed`) to `device` (the session's default if None) and
        publish each read-only as prefix + name."""
        tensors: dict[str, gpud_client.Tensor] = {}
        for name, shape in weight_shapes(config):
            tensor = gpu.tensor(stacked_weight(config, name, shape, seed), device=device)
            gpu.publish(tensor, prefix + name, mode="ro")
            tensors[name] = tensor
            await gpu.flush()  # one weight's upload at a time: the payloads do not pile up in the client
        await gpu.sync()
        return cls(tensors)

    @classmethod
    async def open(cls, gpu: gpud_client.Client, config: Config, prefix: str) -> Weights:
        return cls({name: await gpu.open(prefix + name) for name, _shape in weight_shapes(config)})

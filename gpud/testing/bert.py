"""A BERT sentence encoder written with gpud's op library as a user would (its numpy reference:
`gpud.testing.bert_reference`).

all-MiniLM-L6-v2's model: BERT (6 layers, hidden 384, 12 heads of 32, FFN 1536, exact GELU, post-LN,
LayerNorm eps 1e-12), then the mean of the token states over the attention mask and an L2
normalisation: sentence-transformers' embedding. The weights are Hugging Face's `BertModel` tensors
by their names (`embeddings.word_embeddings.weight`, `encoder.layer.0.attention.self.query.weight`,
...), as `gpu.load_safetensors(path, prefix=...)` loads them and `gpu.open_prefix(prefix)` opens
them in every other session: one copy on the device however many processes embed. The activations
are the weights' dtype (float16 weights: float16 activations, float32 accumulation); the pooled
embedding is float32.

    enc = Encoder(gpu, CONFIGS["all-minilm-l6-v2"], await gpu.open_prefix("minilm/"))
    vectors = await enc.embed(ids, mask)             # eager: queued ops, one readback
    vectors = await enc.embed(ids, mask, "replay")   # a replay graph per (batch, length), built once
    vectors = await enc.embed(ids, mask, "merged")   # one graph per length that every session shares

In `merged` mode the forward is a row-independent graph per length (`rows=True`), published under the
encoder's `graph_prefix` and built for 1, 2, 4 ... `MERGED_ROWS` sentences: a session pads its batch to
the next of these (padding rows are dropped), and the daemon launches the batches that sessions send at
once together, each getting its own rows back.
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

import gpud_client
from gpud.testing.published import published_step
from gpud_client.nn import Embedding, LayerNorm, Linear
from gpud_protocol import LruCache

MODES = ("eager", "replay", "merged")
MERGED_ROWS = 64  # the largest instance of a merged graph: sentences of all sessions in one launch
GRAPHS_KEPT = 8  # replay graphs an encoder keeps (one per batch shape); past it the least recent is freed


@dataclasses.dataclass(frozen=True)
class BertConfig:
    layers: int
    hidden: int
    heads: int
    intermediate: int
    vocab: int
    max_positions: int = 512
    type_vocab: int = 2
    eps: float = 1e-12

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


CONFIGS = {
    "all-minilm-l6-v2": BertConfig(6, 384, 12, 1536, 30_522),
    "tiny": BertConfig(2, 64, 2, 128, 100, max_positions=32),  # the tests' random BERT: heads of 32 (CUDA: flash)
}


def layer_prefix(i: int) -> str:
    return f"encoder.layer.{i}."


def weight_shapes(config: BertConfig) -> Iterator[tuple[str, tuple[int, ...]]]:
    """Every tensor the encoder reads, by its Hugging Face name; matrices are (out, in) as Linear stores them."""
    c = config
    yield "embeddings.word_embeddings.weight", (c.vocab, c.hidden)
    yield "embeddings.position_embeddings.weight", (c.max_positions, c.hidden)
    yield "embeddings.token_type_embeddings.weight", (c.type_vocab, c.hidden)
    yield "embeddings.LayerNorm.weight", (c.hidden,)
    yield "embeddings.LayerNorm.bias", (c.hidden,)
    for i in range(c.layers):
        p = layer_prefix(i)
        for name in ("query", "key", "value"):
            yield f"{p}attention.self.{name}.weight", (c.hidden, c.hidden)
            yield f"{p}attention.self.{name}.bias", (c.hidden,)
        yield f"{p}attention.output.dense.weight", (c.hidden, c.hidden)
        yield f"{p}attention.output.dense.bias", (c.hidden,)
        yield f"{p}attention.output.LayerNorm.weight", (c.hidden,)
        yield f"{p}attention.output.LayerNorm.bias", (c.hidden,)
        yield f"{p}intermediate.dense.weight", (c.intermediate, c.hidden)
        yield f"{p}intermediate.dense.bias", (c.intermediate,)
        yield f"{p}output.dense.weight", (c.hidden, c.intermediate)
        yield f"{p}output.dense.bias", (c.hidden,)
        yield f"{p}output.LayerNorm.weight", (c.hidden,)
        yield f"{p}output.LayerNorm.bias", (c.hidden,)


def random_weights(config: BertConfig, seed: int, dtype: Any = np.float32) -> dict[str, np.ndarray[Any, Any]]:
    """Weights drawn from `seed` (the same in every process), scaled as trained ones are."""
    out = {}
    for name, shape in weight_shapes(config):
        rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
        if name.endswith("LayerNorm.weight"):
            values = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name.endswith("bias"):
            values = 0.1 * rng.standard_normal(shape)
        elif "embeddings" in name:
            values = 0.5 * rng.standard_normal(shape)
        else:
            values = rng.standard_normal(shape) / math.sqrt(shape[1])
        out[name] = values.astype(dtype)
    return out


class Layer:
    """One post-LN encoder layer: self-attention and the GELU FFN, each added back, then LayerNorm (the add
    and the norm one op: `LayerNorm(..., residual=)`)."""

    def __init__(self, gpu: gpud_client.Client, config: BertConfig, t: Mapping[str, Any], prefix: str) -> None:
        self.gpu, self.c = gpu, config
        self.query = Linear.from_dict(gpu, t, prefix + "attention.self.query")
        self.key = Linear.from_dict(gpu, t, prefix + "attention.self.key")
        self.value = Linear.from_dict(gpu, t, prefix + "attention.self.value")
        self.out = Linear.from_dict(gpu, t, prefix + "attention.output.dense")
        self.norm1 = LayerNorm.from_dict(gpu, t, prefix + "attention.output.LayerNorm", config.eps)
        self.ffn_in = Linear.from_dict(gpu, t, prefix + "intermediate.dense", activation="gelu")
        self.ffn_out = Linear.from_dict(gpu, t, prefix + "output.dense")
        self.norm2 = LayerNorm.from_dict(gpu, t, prefix + "output.LayerNorm", config.eps)

    def __call__(self, x: Any, mask: Any, graph: Any = None) -> Any:
        ops, c = self.gpu.ops, self.c
        batch, length, hidden = x.shape
        heads = (batch, length, c.heads, c.head_dim)
        q = self.query(x, graph).reshape(heads)
        k = self.key(x, graph).reshape(heads)
        v = self.value(x, graph).reshape(heads)
        a = ops.attention(q, k, v, key_mask=mask, graph=graph)  # (B, S, heads, head_dim), x's dtype as q's
        x = self.norm1(x, graph, residual=self.out(a.reshape(batch, length, hidden), graph))  # LN(x + out(a))
        h = self.ffn_in(x, graph)  # GELU(x @ w.T + b): in the product's kernel where it applies one
        return self.norm2(x, graph, residual=self.ffn_out(h, graph))


class Encoder:
    """One session's encoder over weights it loaded or opened (read-only residents do). It makes one
    tensor of its own at once (the position table, below): make it outside a `gpu.scope()`, or keep it."""

    def __init__(
        self, gpu: gpud_client.Client, config: BertConfig, tensors: Mapping[str, Any], *, graph_prefix: str = ""
    ) -> None:
        missing = [name for name, _shape in weight_shapes(config) if name not in tensors]
        if missing:
            raise KeyError(f"the weights lack {len(missing)} tensors of the model, e.g. {missing[:3]}")
        self.gpu, self.c = gpu, config
        self.graph_prefix = graph_prefix  # merged mode: the weights' own names, so no other weights share a graph
        ops = gpu.ops
        word = tensors["embeddings.word_embeddings.weight"]
        self.dtype = str(np.dtype(word.dtype).name)
        self.device = int(word.device)
        self.words = Embedding(gpu, word)
        # Every token type id is 0 (single sentences), so the type embedding's row 0 is folded into the
        # position table once, here: one table, one embedding lookup per forward.
        types = tensors["embeddings.token_type_embeddings.weight"].narrow(0, 0, 1)
        self.positions = Embedding(gpu, ops.add(tensors["embeddings.position_embeddings.weight"], types))
        self.norm = LayerNorm.from_dict(gpu, tensors, "embeddings.LayerNorm", config.eps)
        self.layers = [Layer(gpu, config, tensors, layer_prefix(i)) for i in range(config.layers)]
        self._steps: LruCache[tuple[int, int], gpud_client.Step] = LruCache(GRAPHS_KEPT, lambda _key, s: s.free())

    def forward(self, ids: Any, mask: Any, positions: Any, graph: Any = None) -> Any:
        """Queue (or record into `graph`) the embeddings of `ids` (B, S) (int32, uint32, int64 or uint64) with
        `mask` (B, S) float32 (1 where a token is real, 0 where padding) and `positions` (S,) int32:
        (B, hidden) float32, each row of L2 norm 1."""
        ops = self.gpu.ops
        batch, length = ids.shape
        x = ops.add(self.words(ids, graph), self.positions(positions, graph), graph=graph)  # (B, S, H) + (S, H)
        x = self.norm(x, graph)
        for layer in self.layers:
            x = layer(x, mask, graph)
        summed = ops.sum(ops.mul(x, mask.reshape(batch, length, 1), graph=graph), axis=1, graph=graph)
        counts = ops.sum(mask, axis=-1, graph=graph).reshape(batch, 1)
        return ops.normalize(ops.div(summed, counts, graph=graph), 1e-12, graph=graph)

    async def embed(self, ids: np.ndarray[Any, Any], mask: np.ndarray[Any, Any], mode: str = "eager") -> Any:
        """The (B, hidden) float32 embeddings of `ids` (B, S) (integers, a tokenizer's int64 as they are) with
        `mask` (B, S) (nonzero: a real token)."""
        ids64 = np.ascontiguousarray(ids, np.int64)  # one graph input dtype, whatever integers are given
        maskf = np.ascontiguousarray(mask != 0, np.float32)
        if ids64.ndim != 2 or ids64.shape != maskf.shape:
            raise ValueError(f"ids {ids64.shape} and mask {maskf.shape} must be one (batch, length) shape")
        length = ids64.shape[1]
        if length > self.c.max_positions:
            raise ValueError(f"{length} tokens: the model has {self.c.max_positions} positions")
        positions = np.arange(length, dtype=np.int32)  # an input like the others: S * 4 bytes per call
        if mode == "replay":
            step = self._steps.get(ids64.shape) or await self._build(ids64.shape)
            return (await step.replay(ids=ids64, mask=maskf, positions=positions))["embeddings"]
        if mode == "merged":
            return await self._merged(ids64, maskf)
        if mode != "eager":
            raise ValueError(f"mode is one of {MODES}, not {mode!r}")
        gpu = self.gpu
        async with gpu.scope():  # the inputs and every intermediate of this forward are freed at the end
            inputs = [gpu.tensor(a, device=self.device) for a in (ids64, maskf, positions)]
            return await self.forward(*inputs).numpy()

    async def _merged(self, ids: np.ndarray[Any, Any], mask: np.ndarray[Any, Any]) -> Any:
        """The embeddings through the shared row-independent graph of this length, the batch padded."""
        if not self.graph_prefix:
            raise ValueError("merged mode needs the encoder's graph_prefix (the weights' names)")
        batch, length = ids.shape
        if batch > MERGED_ROWS:  # in launches of the largest instance's rows
            parts = [(ids[i : i + MERGED_ROWS], mask[i : i + MERGED_ROWS]) for i in range(0, batch, MERGED_ROWS)]
            return np.concatenate([await self._merged(part_ids, part_mask) for part_ids, part_mask in parts])
        rows = 1 << max(0, batch - 1).bit_length()
        key = (0, length)
        step = self._steps.get(key)
        if step is None:
            name = f"{self.graph_prefix}bert-rows-s{length}"
            step = await published_step(self.gpu, name, lambda: self._build_rows(name, length), share=True)
            self._steps.put(key, step)
        padded_ids, padded_mask = np.zeros((rows, length), np.int64), np.zeros((rows, length), np.float32)
        padded_ids[:batch], padded_mask[:batch] = ids, mask
        padded_mask[batch:, 0] = 1.0  # a padding row sees one token: finite, and dropped
        out = (await step.replay(ids=padded_ids, mask=padded_mask))["embeddings"]
        return out[:batch]

    async def _build_rows(self, name: str, length: int) -> gpud_client.Step:
        step: gpud_client.Step | None = None
        rows = 1
        while rows <= MERGED_ROWS:
            g = self.gpu.graph(name, rows=True)
            ids, mask = g.input("ids", (rows, length), "int64"), g.input("mask", (rows, length), "float32")
            positions = g.empty((length,), "int32")
            g.upload(positions, np.arange(length, dtype=np.int32))  # the same for every row: recorded
            g.output("embeddings", self.forward(ids, mask, positions, graph=g))
            step = await g.build()
            rows *= 2
        assert step is not None
        return step

    async def _build(self, shape: tuple[int, int]) -> gpud_client.Step:
        """The forward for one (batch, length), recorded once into a replay graph of this session."""
        batch, length = shape
        g = self.gpu.graph(f"bert-b{batch}-s{length}")
        ids, mask = g.input("ids", shape, "int64"), g.input("mask", shape, "float32")
        positions = g.input("positions", length, "int32")
        g.output("embeddings", self.forward(ids, mask, positions, graph=g))
        step = await g.build()
        self._steps.put((batch, length), step)
        return step

    def free(self) -> None:
        """This session's own tensors and graphs (the weights are the caller's)."""
        self._steps.clear()  # frees each graph
        self.positions.table.free()

"""A decoder-only transformer run through gpud's op library (its numpy reference: `gpud.testing.reference`).

The shapes are Qwen2.5-0.5B's (24 layers, hidden 896, 14 query heads sharing 2 KV heads of 64,
SwiGLU MLP of 4864, RMSNorm, rotary positions with base 1e6, biases on q/k/v, embeddings tied to
the output); the weights are float16 drawn from a seed, not a checkpoint (nothing to download), so
the tokens mean nothing but every number is checked. `tiny` and `small` keep the structure at sizes
a software rasteriser runs in seconds.

Weights are uploaded once and published read-only: every other session opens them by name, so K
clients decode with one copy in device memory. Each session owns its KV caches and activations.
One decode step is the same op sequence in six modes:

- `dispatch`: each op is its own submission and round trip (what a naive remote GPU costs);
- `coalesced`: the whole step is queued and flushed by the one readback of the next token;
- `graph`: the step is recorded once into a replay graph (published, so other sessions open the
  same instances) and replayed with this step's token ids and positions, the session's caches bound;
- `window`: the same graph, `WINDOW` steps per message (`Step.replay_steps`): each step's argmax is
  copied into the next step's ids on the device, so the token never leaves the GPU between steps; and
  the next window is sent before this one has answered (`chain=True`: it starts from this window's
  last token on the device), so the GPU goes from window to window without waiting for a round trip;
- `merged`: one step graph shared by every session, its KV caches a pool with a slot per session, so
  that the daemon launches the steps of concurrent sessions together (`shared_decoder`);
- `merged-window`: both: `WINDOW` steps of the shared graph per message, the windows that concurrent
  sessions send launched together (each step all their rows, the tokens fed on the device).
"""

from __future__ import annotations

from collections.abc import Awaitable, Iterator
from typing import Any, NamedTuple

import numpy as np

import gpud_client
from gpud.testing.published import published_step
from gpud.testing.transformer_weights import Config, Weights

MODES = ("dispatch", "coalesced", "graph", "window", "merged", "merged-window")
SHARED = ("merged", "merged-window")  # the modes of the shared step graph (`shared_decoder`)
WINDOWED = ("window", "merged-window")  # WINDOW steps per message
WINDOW = 16  # tokens per round trip in `window` mode
OPS_PER_LAYER = 7  # the calls of `step_ops` per layer


class Decoder:
    """One session's decoding: its KV caches and activations, and the step in three modes.

    `batch` sequences decode together, each at its own position; every tensor here is this
    session's, the weights are shared. `logits=True` also reads the logits back (for checking)."""

    def __init__(
        self,
        gpu: gpud_client.Client,
        config: Config,
        params: Weights,
        batch: int = 1,
        *,
        logits: bool = False,
        graph_name: str = "decode",
    ) -> None:
        self.gpu, self.c, self.w, self.batch, self.with_logits = gpu, config, params, batch, logits
        self.graph_name = self.graph_name_for(graph_name, batch, logits)
        self.device = params["embed"].device  # the weights' device, whatever the session's default
        cache = (batch, config.max_len, config.kv_heads, config.head_dim)
        self.k_caches = [self._empty(cache, "float16") for _ in range(config.layers)]
        self.v_caches = [self._empty(cache, "float16") for _ in range(config.layers)]
        self.ids = self._empty((batch,), "int32")
        self.pos = self._empty((batch,), "int32")
        self._work: dict[str, Any] | None = None  # the eager modes' activations, made on first use
        self._step: gpud_client.Step | None = None

    def _empty(self, shape: tuple[int, ...], dtype: str) -> gpud_client.Tensor:
        return self.gpu.empty(shape, dtype, device=self.device)

    @staticmethod
    def graph_name_for(name: str, batch: int, logits: bool) -> str:
        """The published step graph's name: one per batch size (and with or without logits)."""
        return f"{name}-b{batch}{'-logits' if logits else ''}"

    def _workspace(self, make: Any) -> dict[str, Any]:
        return workspace(self.c, self.batch, make)

    def _ops(self, ids: Any, pos: Any, ks: list[Any], vs: list[Any], t: dict[str, Any], g: Any) -> Iterator[None]:
        return step_ops(self.gpu.ops, self.w, self.c, ids, pos, ks, vs, t, g)

    def ops_per_step(self) -> int:
        return 1 + OPS_PER_LAYER * self.c.layers + 2

    async def step(self, ids: np.ndarray[Any, Any], pos: np.ndarray[Any, Any], mode: str) -> Output:
        """Decode one token per sequence: `ids` (B,) at positions `pos` (B,); the next ids (argmax)."""
        ids32, pos32 = np.asarray(ids, np.int32), np.asarray(pos, np.int32)
        if ids32.shape != (self.batch,) or pos32.shape != (self.batch,):
            raise ValueError(f"ids and pos are ({self.batch},) arrays")
        if int(pos32.max()) >= self.c.max_len or int(pos32.min()) < 0:
            raise ValueError(f"positions run from 0 to {self.c.max_len - 1}")
        if mode in ("graph", "window"):
            return (await self.steps(ids32, pos32, 1))[0]
        if mode not in MODES or mode in SHARED:
            raise ValueError(f"mode is one of {MODES[:-2]} ({SHARED}: gpud.testing.shared_decoder)")
        work = self._work
        if work is None:
            work = self._work = self._workspace(self._empty)
        self.ids.upload(ids32)
        self.pos.upload(pos32)
        for _ in self._ops(self.ids, self.pos, self.k_caches, self.v_caches, work, None):
            if mode == "dispatch":
                await self.gpu.flush()
        logits = await work["logits"].numpy() if self.with_logits else None
        return Output(await work["next"].numpy(), logits)

    async def steps(self, ids: np.ndarray[Any, Any], pos: np.ndarray[Any, Any], n: int) -> list[Output]:
        """`n` graph steps in one message from `ids` at `pos`: each step's argmax feeds the next on the device."""
        ids32, pos32 = np.asarray(ids, np.int32), np.asarray(pos, np.int32)
        if int(pos32.max()) + n - 1 >= self.c.max_len:
            raise ValueError(f"positions run from 0 to {self.c.max_len - 1}")
        step = self._step or await self._graph()
        if n == 1:
            got = await step.replay(ids=ids32, pos=pos32, **self._caches())
            return [Output(got["next"], got.get("logits"))]
        return await self.send_steps(ids32, pos32, n)

    def send_steps(
        self, ids: np.ndarray[Any, Any] | None, pos: np.ndarray[Any, Any], n: int
    ) -> Awaitable[list[Output]]:
        """`n` graph steps from `ids` at `pos`, sent now (the step graph opened already, by `step`);
        `ids` None: from the last token of the window sent before, on the device (`chain=True`)."""
        assert self._step is not None, "send_steps after a step has opened the graph"
        if int(pos.max()) + n - 1 >= self.c.max_len:
            raise ValueError(f"positions run from 0 to {self.c.max_len - 1}")
        binds = self._caches()
        binds["pos"] = np.stack([pos + k for k in range(n)]).astype(np.int32)
        if ids is not None:
            binds["ids"] = np.asarray(ids, np.int32)
        return _window(self._step.replay_steps(n, chain=ids is None, **binds), n)

    def launch(self, ids: np.ndarray[Any, Any], pos: np.ndarray[Any, Any]) -> None:
        """One graph step queued without a readback (a prompt token, whose next id nobody reads): it goes
        with the next message (the step graph opened already)."""
        assert self._step is not None, "launch after a step has opened the graph"
        self._step.launch(ids=np.asarray(ids, np.int32), pos=np.asarray(pos, np.int32), **self._caches())

    def _caches(self) -> dict[str, Any]:
        """The step graph's bound tensors: this session's KV caches."""
        binds: dict[str, Any] = {f"k{i}": cache for i, cache in enumerate(self.k_caches)}
        binds.update({f"v{i}": cache for i, cache in enumerate(self.v_caches)})
        return binds

    async def _graph(self) -> gpud_client.Step:
        """Open the published step graph, or record, build and publish it."""
        self._step = await published_step(self.gpu, self.graph_name, self._build)
        return self._step

    async def _build(self) -> gpud_client.Step:
        g = self.gpu.graph(self.graph_name)
        b, c = self.batch, self.c
        cache = (b, c.max_len, c.kv_heads, c.head_dim)
        ks = [g.bind(f"k{i}", cache, "float16") for i in range(c.layers)]
        vs = [g.bind(f"v{i}", cache, "float16") for i in range(c.layers)]
        ids, pos = g.input("ids", b, "int32"), g.input("pos", b, "int32")
        work = self._workspace(g.empty)
        for _ in self._ops(ids, pos, ks, vs, work, g):
            pass
        g.output("next", work["next"])
        g.feed("next", into="ids")  # in `window` mode the argmax is the next step's token, on the device
        if self.with_logits:
            g.output("logits", work["logits"])
        return await g.build()

    def free(self) -> None:
        for tensor in [*self.k_caches, *self.v_caches, self.ids, self.pos, *(self._work or {}).values()]:
            tensor.free()
        if self._step is not None:
            self._step.free()


def workspace(c: Config, b: int, make: Any) -> dict[str, Any]:
    """The activations of one step of `b` sequences, made by `make(shape, dtype)` (tensors, or a graph's)."""
    shapes = {
        "x": (b, c.hidden),
        "x2": (b, c.hidden),
        "qkv": (b, c.qkv_width),
        "q": (b, c.heads * c.head_dim),
        "attn": (b, c.heads, c.head_dim),
        "o": (b, c.hidden),
        "gate_up": (b, 2 * c.intermediate),
        "act": (b, c.intermediate),
        "down": (b, c.hidden),
        "logits": (b, c.vocab),
    }
    work = {name: make(shape, "float32") for name, shape in shapes.items()}
    work["next"] = make((b,), "int32")
    # The views the heads need, made once: the same views every step (stable to every cache).
    work["q3"] = work["q"].reshape(b, c.heads, c.head_dim)
    work["attn2"] = work["attn"].reshape(b, c.heads * c.head_dim)
    return work


def step_ops(
    ops: Any, w: Any, c: Config, ids: Any, pos: Any, ks: list[Any], vs: list[Any], t: dict[str, Any], g: Any
) -> Iterator[None]:
    """Queue (or record, into graph `g`) one decode step, yielding after each op. The fused ops of the
    op library: q, k and v in one matmul, split, rotated and cached by `rotary_kv_append`; gate and up
    in one matmul, `silu_and_mul`; each residual add and the norm after it taken into the product that
    follows them (`rmsnorm_matmul`: one launch on CUDA at one or two rows)."""
    x, x2, attn, q3 = t["x"], t["x2"], t["attn"], t["q3"]

    def linear(src: Any, name: str, out: Any) -> None:
        ops.matmul(src, w[name], transpose_w=True, out=out, graph=g)

    def norm_linear(src: Any, residual: Any, total: Any, norm: str, name: str, out: Any, bias: Any = None) -> None:
        ops.rmsnorm_matmul(
            src,
            w[norm],
            w[name],
            c.eps,
            residual=residual,
            sum_out=total,
            transpose_w=True,
            bias=bias,
            out=out,
            graph=g,
        )

    ops.embedding(ids, w["embed"], out=x, graph=g)
    yield
    for i in range(c.layers):
        p = f"layer{i}."
        if i == 0:  # the embeddings: nothing added before the norm
            norm_linear(x, None, None, p + "norm1", p + "qkv", t["qkv"], w[p + "qkv_bias"])
        else:  # the last layer's output added to its input: the residual stream x
            norm_linear(x2, t["down"], x, p + "norm1", p + "qkv", t["qkv"], w[p + "qkv_bias"])
        yield
        heads = {"heads": c.heads, "kv_heads": c.kv_heads, "base": c.rope_base}
        ops.rotary_kv_append(t["qkv"], ks[i], vs[i], pos, **heads, out=q3, graph=g)
        yield
        ops.attention_decode(q3, ks[i], vs[i], pos, out=attn, graph=g)
        yield
        linear(t["attn2"], p + "o", t["o"])
        yield
        norm_linear(x, t["o"], x2, p + "norm2", p + "gate_up", t["gate_up"])
        yield
        ops.silu_and_mul(t["gate_up"], out=t["act"], graph=g)
        yield
        linear(t["act"], p + "down", t["down"])
        yield
    norm_linear(x2, t["down"], x, "norm", "embed", t["logits"])
    yield
    ops.argmax(t["logits"], out=t["next"], graph=g)
    yield


class Output(NamedTuple):
    next: np.ndarray[Any, Any]  # (B,) int32: the argmax of each sequence's logits
    logits: np.ndarray[Any, Any] | None  # (B, vocab) float32, when asked for


async def _window(sent: Awaitable[dict[str, np.ndarray[Any, Any]]], n: int) -> list[Output]:
    got = await sent
    return [Output(got["next"][k], got["logits"][k] if "logits" in got else None) for k in range(n)]

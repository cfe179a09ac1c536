"""The decode step every session shares (`merged` and `merged-window` modes): one published slot graph
whose KV caches hold a slot per session, so that the daemon runs the steps (or windows of steps) that
concurrent sessions send together as one launch of the smallest instance holding their slots.

The first session records the step for 1, 2, 4 ... `pool` rows (each instance sees the first rows of
the pooled caches) and publishes it; the others open it. Each session replays one row: its token id
and position. Padding rows take position -1, which the step's `kv_append` drops, so a launch never
touches the cache of a slot it does not carry. A session's slot is zeroed when it takes it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import gpud_client
from gpud.testing.published import published_step
from gpud.testing.transformer import SHARED, Decoder, Output, step_ops, workspace
from gpud.testing.transformer_weights import Config, Weights

POOL = 32  # sessions decoding at once through one shared step


class SharedDecoder:
    """One sequence of this session, decoded through the shared slot graph."""

    batch = 1

    def __init__(
        self,
        gpu: gpud_client.Client,
        config: Config,
        params: Weights,
        *,
        logits: bool = False,
        graph_name: str = "decode",
        pool: int = POOL,
    ) -> None:
        self.gpu, self.c, self.w, self.with_logits, self.pool = gpu, config, params, logits, pool
        self.graph_name = f"{graph_name}-slots{pool}{'-logits' if logits else ''}"
        self.device = params["embed"].device
        self._step: gpud_client.Step | None = None

    async def step(self, ids: np.ndarray[Any, Any], pos: np.ndarray[Any, Any], mode: str = "merged") -> Output:
        return (await self.steps(ids, pos, 1))[0]

    async def steps(self, ids: np.ndarray[Any, Any], pos: np.ndarray[Any, Any], n: int) -> list[Output]:
        """`n` steps in one message (`merged-window`): each step's argmax feeds the next on the device,
        and the daemon launches the windows that other sessions send at once together."""
        ids32, pos32 = np.asarray(ids, np.int32).reshape(-1), np.asarray(pos, np.int32).reshape(-1)
        if ids32.shape != (1,) or pos32.shape != (1,):
            raise ValueError("a shared decoder decodes one sequence: ids and pos are (1,) arrays")
        if not 0 <= int(pos32[0]) <= self.c.max_len - n:
            raise ValueError(f"positions run from 0 to {self.c.max_len - 1}")
        step = self._step or await self._graph()
        if n == 1:
            got = await step.replay(ids=ids32, pos=pos32)
            return [Output(got["next"], got.get("logits"))]
        positions = np.stack([pos32 + k for k in range(n)]).astype(np.int32)
        got = await step.replay_steps(n, ids=ids32, pos=positions)
        return [Output(got["next"][k], got["logits"][k] if "logits" in got else None) for k in range(n)]

    async def _graph(self) -> gpud_client.Step:
        """Open the shared step, or record, build and publish it (if another session published it first,
        use that one: every session must share one pool)."""
        self._step = await published_step(self.gpu, self.graph_name, self._build, share=True)
        return self._step

    async def _build(self) -> gpud_client.Step:
        gpu, c, pool = self.gpu, self.c, self.pool
        cache = (pool, c.max_len, c.kv_heads, c.head_dim)
        k_pools = [gpu.empty(cache, "float16", device=self.device) for _ in range(c.layers)]
        v_pools = [gpu.empty(cache, "float16", device=self.device) for _ in range(c.layers)]
        step: gpud_client.Step | None = None
        for rows in sorted({1 << i for i in range(pool.bit_length()) if 1 << i <= pool} | {pool}):
            g = gpu.graph(self.graph_name, slots=pool)
            ids, pos = g.input("ids", rows, "int32"), g.input("pos", rows, "int32", pad=-1)
            ks, vs = [g.state(p, rows) for p in k_pools], [g.state(p, rows) for p in v_pools]
            work = workspace(c, rows, g.empty)
            for _ in step_ops(gpu.ops, self.w, c, ids, pos, ks, vs, work, g):
                pass
            g.output("next", work["next"])
            g.feed("next", into="ids")  # `merged-window`: the argmax is the next step's token, on the device
            if self.with_logits:
                g.output("logits", work["logits"])
            step = await g.build()
        for tensor in [*k_pools, *v_pools]:
            tensor.free()  # the graph holds them
        assert step is not None
        return step

    def free(self) -> None:
        if self._step is not None:
            self._step.free()


def decoder_for(
    mode: str,
    gpu: gpud_client.Client,
    config: Config,
    params: Weights,
    *,
    batch: int = 1,
    logits: bool = False,
    graph_name: str = "decode",
) -> Decoder | SharedDecoder:
    """The decoder a mode runs: the shared slot graph for `merged` and `merged-window` (one sequence), else a
    session's own."""
    if mode in SHARED:
        if batch != 1:
            raise ValueError("merged mode decodes one sequence per session")
        return SharedDecoder(gpu, config, params, logits=logits, graph_name=graph_name)
    return Decoder(gpu, config, params, batch, logits=logits, graph_name=graph_name)

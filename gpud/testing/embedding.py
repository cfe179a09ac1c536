"""K client processes embedding sentences through one daemon (`gpud demo embed`, `gpud bench embed`).

The encoder's weights are loaded once into read-only residents (`gpu.load_safetensors` with a prefix
of the run's own); each process is an ordinary client that opens them (`gpu.open_prefix`), builds
its own `Encoder` and embeds its batches in the modes asked for: one warm-up per batch and mode
(compiles, the replay graph's build), then, all processes starting together, `reps` timed ones.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import time
import uuid
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

import gpud_client
from gpud.testing.bert import CONFIGS, Encoder
from gpud.testing.processes import gather

MODEL = "all-minilm-l6-v2"
BARRIER_S = 600.0  # the longest a process waits for the others before a timed run


class Batch(NamedTuple):
    ids: np.ndarray[Any, Any]  # (B, S) integers (minilm.tokenize: int64)
    mask: np.ndarray[Any, Any]  # (B, S), nonzero where a token is real


def new_prefix() -> str:
    """Names for one run's weights (runs side by side do not collide)."""
    return f"minilm/{uuid.uuid4().hex[:12]}/"


async def publish(address: str, weights: Path, prefix: str) -> dict[str, Any]:
    """Load the weights into read-only residents named prefix + name; how long it took, device memory."""
    async with gpud_client.connect(address) as gpu:
        before = (await gpu.stats())["devices"][gpu.device]["memory_in_use"]
        t0 = time.perf_counter()
        await gpu.load_safetensors(weights / "model.safetensors", prefix=prefix)
        seconds = time.perf_counter() - t0
        after = (await gpu.stats())["devices"][gpu.device]["memory_in_use"]
        return {"upload_s": seconds, "weights_memory": after - before}


async def unpublish(address: str, prefix: str) -> None:
    async with gpud_client.connect(address) as gpu:
        while names := [r.name for r in await gpu.residents(prefix)]:
            for name in names:
                gpu.unpublish(name)
            await gpu.sync()


async def embed_all(encoder: Encoder, batches: list[Batch], modes: tuple[str, ...], reps: int, wait: Any) -> Any:
    """Per (batch, mode): a warm-up, `wait()`, then `reps` timed runs. ({key: seconds}, {key: embeddings})."""
    seconds: dict[tuple[int, str], list[float]] = {}
    out: dict[tuple[int, str], np.ndarray[Any, Any]] = {}
    for i, batch in enumerate(batches):
        for mode in modes:
            out[(i, mode)] = await encoder.embed(batch.ids, batch.mask, mode)
            wait()
            times = []
            for _ in range(reps):
                t0 = time.perf_counter()
                await encoder.embed(batch.ids, batch.mask, mode)
                times.append(time.perf_counter() - t0)
            seconds[(i, mode)] = times
    return seconds, out


async def _client(
    address: str, prefix: str, batches: list[Batch], modes: tuple[str, ...], reps: int, barrier: Any
) -> Any:
    async with gpud_client.connect(address) as gpu:
        encoder = Encoder(gpu, CONFIGS[MODEL], await gpu.open_prefix(prefix), graph_prefix=prefix)
        result = await embed_all(encoder, batches, modes, reps, lambda: barrier.wait(BARRIER_S))
        encoder.free()
        return result


def _process(
    index: int,
    address: str,
    prefix: str,
    batches: list[Batch],
    modes: tuple[str, ...],
    reps: int,
    barrier: Any,
    events: Any,
) -> None:
    try:
        result = asyncio.run(_client(address, prefix, batches, modes, reps, barrier))
    except BaseException as exc:  # reported to the parent, which fails the run
        barrier.abort()
        events.put(("failed", index, f"{type(exc).__name__}: {exc}"))
        raise
    events.put(("done", index, result))


def run_processes(
    address: str, prefix: str, work: list[list[Batch]], modes: tuple[str, ...], reps: int
) -> list[tuple[dict[tuple[int, str], list[float]], dict[tuple[int, str], np.ndarray[Any, Any]]]]:
    """One process per item of `work` (its batches), all embedding at once: each one's (seconds, embeddings)."""
    ctx = mp.get_context("spawn")
    events = ctx.Queue()
    barrier = ctx.Barrier(len(work))
    procs = [
        ctx.Process(target=_process, args=(i, address, prefix, batches, modes, reps, barrier, events))
        for i, batches in enumerate(work)
    ]
    return gather(procs, events, "an embedding process exited without reporting", "embedding process {} failed: {}")

"""K client processes decoding at once through one daemon (the demo's and `gpud bench decode`'s).

Each process is an ordinary gpud client: it opens the published weights, makes its own KV caches,
warms up (compiles, builds or opens the step graph), waits for a common start time, then decodes
`tokens` greedy tokens after a prompt of its own, reporting each step on a queue.

Over several devices every device holds a copy of the weights, and every session (the publishing one,
the clients, the unpublishing one) keeps to one device: it connects with `device=`, so that a daemon
running a process per device (`process_per_device`) sends it to that device's worker, where the copy
and the step graphs it publishes live.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import time
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np

import gpud_client
from gpud.testing.generation import generate
from gpud.testing.processes import gather
from gpud.testing.reference import greedy_mismatch, reference_logits
from gpud.testing.shared_decoder import POOL, decoder_for
from gpud.testing.transformer import Decoder
from gpud.testing.transformer_weights import CONFIGS, Config, Weights, weights

PROMPT = 4  # prompt tokens fed before the greedy ones
WARMUP_S = 5.0  # the time every client has to open the weights and warm up before the common start
STALL_S = 300.0  # no step from any client for this long ends the run as stalled (naming who never finished)

Progress = Callable[[int, int, int], None]  # (client, steps done, steps in all)


def prompt(seed: int, config: Config) -> np.ndarray[Any, Any]:
    """Client `seed`'s prompt: (1, PROMPT) token ids."""
    return np.random.default_rng(seed).integers(0, config.vocab, (1, PROMPT), dtype=np.int32)


def new_prefix() -> str:
    """Names for one run's published weights and step graphs (runs side by side do not collide)."""
    return f"decode/{uuid.uuid4().hex[:12]}/"


def device_prefix(prefix: str, client: int, devices: int) -> str:
    """The names client `client` uses: the run's own on one device; over several, the weights and step
    graphs of device `client % devices` (clients spread round-robin, each device holding one copy)."""
    return prefix if devices == 1 else f"{prefix}d{client_device(client, devices)}/"


def client_device(client: int, devices: int) -> int:
    """The device client `client` connects to: the one whose copy `device_prefix` names."""
    return client % devices


async def publish(address: str, model: str, prefix: str, seed: int = 0, devices: int = 1) -> dict[str, Any]:
    """Upload and publish the weights (a copy per device over several, each from a session on its
    device); how long it took and the device memory one copy holds."""
    seconds, held = 0.0, 0
    for device in range(devices):
        async with gpud_client.connect(address, device=device) as gpu:
            before = (await gpu.stats())["device"]["memory_in_use"]
            t0 = time.perf_counter()
            await Weights.publish(gpu, CONFIGS[model], seed, device_prefix(prefix, device, devices))
            seconds += time.perf_counter() - t0
            after = (await gpu.stats())["device"]["memory_in_use"]
            if device == 0:
                held = after - before
    return {"upload_s": seconds, "weights_memory": held, "devices": devices}


async def unpublish(address: str, model: str, prefix: str, devices: int = 1) -> None:
    """Remove the run's weights and step graphs, each device's from a session there (a name already
    gone is skipped)."""
    for device in range(devices):
        names = device_prefix(prefix, device, devices)
        graphs = [Decoder.graph_name_for(names + "step", batch=1, logits=False), f"{names}step-slots{POOL}"]
        async with gpud_client.connect(address, device=device) as gpu:
            for name in Weights.names(CONFIGS[model], names):
                gpu.unpublish(name)
                with contextlib.suppress(gpud_client.NotFound):
                    await gpu.sync()
            for graph in graphs:
                gpu.unpublish_graph(graph)  # the session graph's and the shared (merged) one's
                with contextlib.suppress(gpud_client.NotFound):
                    await gpu.sync()


# Every mode's tokens agree exactly: each computes a row as it would alone. A merged step runs a
# session's row among up to POOL others, and every op of the step still sums that row in the same
# order (matmul takes up to 32 float32 rows through matvec in groups: `matvec_groups`).


def reference_mismatch(model: str, tokens: list[int], seed: int = 0) -> str:
    """Client `seed`'s greedy `tokens` against the numpy reference fed the same ones ("" when they are its)."""
    config = CONFIGS[model]
    fed = prompt(seed, config)[0].tolist()
    logits = reference_logits(config, weights(config, 0), fed, tokens)
    return greedy_mismatch(tokens, logits[len(fed) - 1 :])


async def _client(
    address: str, device: int, model: str, prefix: str, mode: str, tokens: int, seed: int, start_at: float, events: Any
) -> dict[str, Any]:
    config = CONFIGS[model]
    steps = PROMPT - 1 + tokens
    async with gpud_client.connect(address, device=device) as gpu:
        params = await Weights.open(gpu, config, prefix)
        decoder = decoder_for(mode, gpu, config, params, graph_name=prefix + "step")
        # Compiles, builds or opens the graph; the timed run starts again at position 0 (attention
        # reads the cache only up to the current position, so nothing of this run is seen).
        await generate(decoder, prompt(seed, config), 1, mode)
        await asyncio.sleep(max(0.0, start_at - time.time()))
        done = 0
        traces: list[gpud_client.Trace] = []

        def stepped() -> None:
            nonlocal done
            done += 1
            events.put(("step", seed, done, steps))
            if gpu.last_trace is not None:  # a daemon started with --trace
                traces.append(gpu.last_trace)

        t0 = time.perf_counter()
        out, _ = await generate(decoder, prompt(seed, config), tokens, mode, on_step=stepped)
        seconds = time.perf_counter() - t0
        device_stats = (await gpu.stats())["device"]  # the session's: the weights' device
        peak = device_stats["memory_in_use"]
        decoder.free()
        return {
            "client": seed,
            "seconds": seconds,
            "steps": steps,
            "tokens": out[0].tolist(),
            "memory": peak,
            "device_stats": {k: v for k, v in device_stats.items() if not isinstance(v, dict)},
            "stages_median_us": gpud_client.Trace.median_stages_us(traces),
        }


def _process(
    address: str, device: int, model: str, prefix: str, mode: str, tokens: int, seed: int, start_at: float, events: Any
) -> None:
    try:
        result = asyncio.run(_client(address, device, model, prefix, mode, tokens, seed, start_at, events))
    except BaseException as exc:  # reported to the parent, which fails the run
        events.put(("failed", seed, f"{type(exc).__name__}: {exc}"))
        raise
    events.put(("done", seed, result))


def run_clients(
    address: str,
    model: str,
    prefix: str,
    mode: str,
    k: int,
    tokens: int,
    progress: Progress | None = None,
    devices: int = 1,
) -> dict[str, Any]:
    """K processes decoding `tokens` tokens each in `mode` (spread round-robin over `devices`, each
    published by `publish`); their results and the aggregate rate."""
    ctx = mp.get_context("spawn")
    events = ctx.Queue()
    start_at = time.time() + WARMUP_S + 0.5 * k
    procs = [
        ctx.Process(
            target=_process,
            args=(
                address,
                client_device(seed, devices),
                model,
                device_prefix(prefix, seed, devices),
                mode,
                tokens,
                seed,
                start_at,
                events,
            ),
        )
        for seed in range(k)
    ]

    def step(event: tuple[Any, ...]) -> None:
        if event[0] == "step" and progress is not None:
            progress(event[1], event[2], event[3])

    rows: list[dict[str, Any]] = gather(
        procs, events, "a decoding client exited without reporting", "client {} failed: {}", step, STALL_S
    )
    wall = max(r["seconds"] for r in rows)
    return {
        "mode": mode,
        "clients": k,
        "tokens_per_s": sum(r["steps"] for r in rows) / wall,  # one token fed or made per step
        "per_client_tokens_per_s": [r["steps"] / r["seconds"] for r in rows],
        "ms_per_token": [1e3 * r["seconds"] / r["steps"] for r in rows],
        "tokens": [r["tokens"] for r in rows],
        "peak_memory": max(r["memory"] for r in rows),
        "stages_median_us": rows[0]["stages_median_us"],  # client 0's
        "device_stats": rows[0]["device_stats"],  # when client 0 finished
        "devices": devices,
    }

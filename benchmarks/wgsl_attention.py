"""The WGSL full-attention kernels through a webgpu daemon, before and after, in one run.

    python3 -m benchmarks.wgsl_attention [--quick] [--json FILE] [--reps N] [--encoder]

"before" is the split kernel (`attention_<q>_<kv>`, one 256-thread workgroup per query row and split of
the keys, then `attention_combine`), which the client picked for every full attention on WebGPU until
attention_tiled; `gpu.ops.attention(..., splits=n)` still runs it, n being what the client picked then
(one split for these shapes: they have 1,024 query rows and more). "after" is `gpu.ops.attention` as it
is, attention_tiled (one pass, blocks of query rows sharing tiles of keys). Both run in one daemon on the
same tensors, shape by shape; each output is checked against numpy float64 (the tests' bound, 1e-5 of
max(1, |ref|)) before it is timed.

Shapes: all-MiniLM-L6-v2's attention over 16 sentences of 62 tokens (12 heads of 32, a float32 key mask
as gpud.testing.bert passes it, the first sentence 62 tokens and the others shorter), q/k/v float32 and
float16; BERT-base's heads (12 of 64) over the same batch; a causal 128-token prefill with Qwen2.5-0.5B's
heads (14 query heads sharing 2 KV heads of 64, float16). `--encoder` also times the whole MiniLM encoder
(random weights, float32, eager) over the same batch with each attention, and gives attention's share.

Timing as benchmarks.wgsl_matmul: `calls` queued back to back then one sync, per call; the best of the
repetitions (2, --quick 1); wall time, and the daemon's CPU time, which on lavapipe (LP_NUM_THREADS=0:
the shader runs in the daemon's own thread) holds still while other processes share the cores.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import gpud_client
from benchmarks import write_json
from benchmarks.wgsl_matmul import _cpu_seconds
from gpud.testing.spawn import daemon

SHAPES = [  # name, B, T, S, Hq, Hkv, D, dtype, causal, key mask
    ("minilm 16x62", 16, 62, 62, 12, 12, 32, "float32", False, True),
    ("minilm 16x62 f16", 16, 62, 62, 12, 12, 32, "float16", False, True),
    ("bert-base 16x62", 16, 62, 62, 12, 12, 64, "float32", False, True),
    ("qwen prefill 128", 1, 128, 128, 14, 2, 64, "float16", True, False),
]
CALL_SECONDS = 0.3  # aim for a repetition this long
MAX_CALLS = 100
BOUND = 1e-5  # of max(1, |ref|): tests/ops/test_attention.py's float32 tolerance


def _reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, seen: np.ndarray) -> np.ndarray:
    """Attention in float64: q (B, T, Hq, D), k and v (B, S, Hkv, D), seen (B, T, S)."""
    rep = q.shape[2] // k.shape[2]
    k64, v64 = (np.repeat(a.astype(np.float64), rep, axis=2) for a in (k, v))
    scores = np.einsum("bthd,bshd->bhts", q.astype(np.float64), k64) / math.sqrt(q.shape[-1])
    scores = np.where(seen[:, None], scores, -np.inf)
    top = scores.max(axis=-1, keepdims=True)
    w = np.where(seen[:, None], np.exp(scores - np.where(np.isfinite(top), top, 0)), 0)
    total = w.sum(axis=-1, keepdims=True)
    out = np.einsum("bhts,bshd->bthd", w / np.where(total > 0, total, 1), v64)
    return np.asarray(out)


def _split_count(rows: int, keys: int) -> int:
    """The splits the client picked for full attention before attention_tiled (gpud_client.ops.attention)."""
    tiles = -(-keys // 256)
    return max(1, min(tiles, 64, -(-1024 // rows)))


async def _time(gpu: gpud_client.Client, call: Callable[[], object], reps: int, pid: int) -> dict[str, float]:
    """Per call: one call sizes `calls`, then `reps` repetitions of that many; the best of each clock."""
    t0 = time.perf_counter()
    call()
    await gpu.sync()
    calls = max(1, min(MAX_CALLS, math.ceil(CALL_SECONDS / (time.perf_counter() - t0))))
    walls, cpus = [], []
    for _ in range(reps):
        cpu0, t0 = _cpu_seconds(pid), time.perf_counter()
        for _ in range(calls):
            call()
        await gpu.sync()
        wall, cpu1 = time.perf_counter() - t0, _cpu_seconds(pid)
        walls.append(wall / calls)
        if cpu0 is not None and cpu1 is not None:
            cpus.append((cpu1 - cpu0) / calls)
    cpu_ms = min(cpus) * 1e3 if cpus else float("nan")
    return {"calls": calls, "wall_ms": min(walls) * 1e3, "daemon_cpu_ms": cpu_ms}


async def _shapes(gpu: gpud_client.Client, pid: int, reps: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(0)
    rows: list[dict[str, Any]] = []
    for name, b, t, s, hq, hkv, d, dtype, causal, masked in SHAPES:
        q = rng.standard_normal((b, t, hq, d)).astype(dtype)
        k, v = (rng.standard_normal((b, s, hkv, d)).astype(dtype) for _ in range(2))
        lengths = np.concatenate([[s], rng.integers(s // 4, s + 1, b - 1)])
        keep = np.arange(s)[None, :] < lengths[:, None] if masked else np.ones((b, s), bool)
        seen = np.broadcast_to(keep[:, None, :], (b, t, s)).copy()
        if causal:
            seen &= np.arange(s)[None, None, :] <= np.arange(t)[None, :, None] + (s - t)
        ref = _reference(q, k, v, seen)
        tq, tk, tv = gpu.tensor(q), gpu.tensor(k), gpu.tensor(v)
        mask = gpu.tensor(keep.astype(np.float32)) if masked else None
        out = gpu.empty((b, t, hq, d), "float32")
        splits = _split_count(b * t * hq, s)
        ways = {
            "before": functools.partial(gpu.ops.attention, tq, tk, tv, causal=causal, key_mask=mask, splits=splits),
            "after": functools.partial(gpu.ops.attention, tq, tk, tv, causal=causal, key_mask=mask),
        }
        for way, attention in ways.items():
            kernels = set(gpu.ops._kernels)
            attention(out=out)
            got = (await out.numpy()).astype(np.float64)
            error = float(np.max(np.abs(got - ref) / (BOUND * np.maximum(1.0, np.abs(ref)))))
            if not error <= 1:
                raise AssertionError(f"{way} {name}: error {error:.3g} x the bound")
            timing = await _time(gpu, functools.partial(attention, out=out), reps, pid)
            used = sorted(set(gpu.ops._kernels) - kernels) or "(registered earlier)"
            shape = {"b": b, "t": t, "s": s, "hq": hq, "hkv": hkv, "d": d, "dtype": dtype, "causal": causal}
            rows.append({"shape": name, **shape, "way": way, "kernels": used, **timing, "error_of_bound": error})
        for tensor in (tq, tk, tv, out, *([mask] if mask is not None else [])):
            tensor.free()
    return rows


async def _encoder(gpu: gpud_client.Client, pid: int, reps: int) -> list[dict[str, Any]]:
    """The MiniLM encoder (random float32 weights) over 16 x 62 tokens, eager, with each attention."""
    from gpud.testing.bert import CONFIGS, Encoder, random_weights

    config = CONFIGS["all-minilm-l6-v2"]
    weights = {name: gpu.tensor(a) for name, a in random_weights(config, 0).items()}
    encoder = Encoder(gpu, config, weights)
    rng = np.random.default_rng(1)
    ids = rng.integers(0, config.vocab, (16, 62)).astype(np.int32)
    mask = (np.arange(62)[None, :] < np.concatenate([[62], rng.integers(15, 63, 15)])[:, None]).astype(np.float32)
    attention = gpu.ops.attention
    rows = []
    results: dict[str, Any] = {}
    try:
        for way, splits in (("before", _split_count(16 * 62 * config.heads, 62)), ("after", None)):
            gpu.ops.attention = functools.partial(attention, splits=splits)  # type: ignore[method-assign]
            results[way] = await encoder.embed(ids, mask)
            best_wall, best_cpu = math.inf, math.inf
            for _ in range(reps):
                t0, cpu0 = time.perf_counter(), _cpu_seconds(pid)
                await encoder.embed(ids, mask)
                best_wall = min(best_wall, time.perf_counter() - t0)
                cpu1 = _cpu_seconds(pid)
                if cpu0 is not None and cpu1 is not None:
                    best_cpu = min(best_cpu, cpu1 - cpu0)
            rows.append({"way": way, "wall_ms": best_wall * 1e3, "daemon_cpu_ms": best_cpu * 1e3})
    finally:
        del gpu.ops.attention
    difference = float(np.abs(results["before"] - results["after"]).max())
    if not difference < 1e-4:
        raise AssertionError(f"the encoder's embeddings differ by {difference:.3g} between the two attentions")
    encoder.free()
    return rows


async def _measure(address: str, pid: int, args: argparse.Namespace) -> dict[str, Any]:
    reps = 1 if args.quick else args.reps
    async with gpud_client.connect(address) as gpu:
        device = gpu.devices[gpu.device] if gpu.devices else {}
        measured: dict[str, Any] = {"device": device, "reps": reps, "results": await _shapes(gpu, pid, reps)}
        if args.encoder:
            measured["encoder"] = await _encoder(gpu, pid, reps)
    return measured


def _print(measured: dict[str, Any]) -> dict[str, float]:
    cpu = measured["device"].get("adapter_type") == "CPU"
    key = "daemon_cpu_ms" if cpu else "wall_ms"
    print(f"\n{measured['device'].get('name', '?')}: ms per call ({'daemon CPU' if cpu else 'wall'})")
    print(f"{'shape':<20} {'before':>9} {'after':>9} {'speed-up':>8}")
    rows = {(r["shape"], r["way"]): r for r in measured["results"]}
    speedups: dict[str, float] = {}
    for shape in dict.fromkeys(r["shape"] for r in measured["results"]):
        before, after = rows[shape, "before"][key], rows[shape, "after"][key]
        speedups[shape] = before / after
        print(f"{shape:<20} {before:9.2f} {after:9.2f} {before / after:7.2f}x")
    encoder = {r["way"]: r[key] for r in measured.get("encoder", [])}
    if encoder:
        speedups["encoder"] = encoder["before"] / encoder["after"]
        print(f"{'minilm encoder':<20} {encoder['before']:9.1f} {encoder['after']:9.1f} {speedups['encoder']:7.2f}x")
        for way in ("before", "after"):  # the encoder's 6 layers each run one attention of the first shape
            share = 6 * rows["minilm 16x62", way][key] / encoder[way]
            speedups[f"attention share of the encoder, {way}"] = share
            print(f"  attention's share of the encoder, {way}: {share:.0%}")
    return speedups


def main(args: argparse.Namespace) -> int:
    os.environ.setdefault("LP_NUM_THREADS", "0")  # lavapipe: the shader in the daemon's thread (see above)
    with daemon("webgpu") as (address, proc):
        measured = asyncio.run(_measure(address, proc.pid, args))
    speedups = _print(measured)
    write_json(
        args.json,
        {
            "benchmark": "wgsl-attention",
            "quick": bool(args.quick),
            "LP_NUM_THREADS": os.environ["LP_NUM_THREADS"],
            "before": "gpu.ops.attention(..., splits=n): attention_<q>_<kv> + attention_combine",
            "after": "gpu.ops.attention: attention_tiled",
            **measured,
            "speedup": speedups,
        },
    )
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one repetition")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--reps", type=int, default=2, help="repetitions, the best kept (default 2)")
    parser.add_argument("--encoder", action="store_true", help="also the whole MiniLM encoder, before and after")
    raise SystemExit(main(parser.parse_args()))

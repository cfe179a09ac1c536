"""Each op kind of one all-MiniLM-L6-v2 forward, timed alone through a webgpu daemon at the model's shapes.

    python -m benchmarks.wgsl_minilm_ops [--batch 16] [--length 60] [--dtype float16] [--reps 5]
                                         [--ops matmul,attention,...] [--forward] [--json FILE]

The shapes are gpud.testing.bert's forward over `batch` sentences of `length` tokens (x is (B, S, 384)):
Linear 384->384 (q, k, v, out: 4 a layer), 384->1536 and 1536->384 (with bias, the weight (N, K) as a
Linear stores it), attention (12 heads of 32, a (B, S) float32 key mask with a quarter of each row
padding), layernorm, exact gelu, add, the two embeddings, and the pooling's ops (mul by the mask, sum
over the tokens, div, normalize). Activations and weights are `dtype` (float16: the real model's).
Printed per op: its calls in one forward, milliseconds per call (median of `reps` repetitions, each
`calls` dispatches queued back to back and one sync), the share of the forward, and what the call must
do: GFLOP (multiply-adds count 2) and MB read + written, and the rate reached (GFLOP/s or GB/s).
`--forward` also times whole eager forwards of a random MiniLM of that dtype in the same daemon.

Clocks: wall time, and the daemon's CPU time, which with LP_NUM_THREADS=0 (set here unless already set:
lavapipe then runs the shaders in the daemon's submitting thread) holds still while other processes
share the cores. Set LP_NUM_THREADS=2 to time with the threads the daemon uses by default (wall only).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

import gpud_client
from benchmarks import write_json
from benchmarks.wgsl_matmul import _cpu_seconds
from gpud.testing.bert import CONFIGS, Encoder, random_weights
from gpud.testing.spawn import daemon

CALL_SECONDS = 0.3  # aim for a repetition this long
MAX_CALLS = 50


class Op(NamedTuple):
    name: str
    per_forward: int  # calls in one forward
    gflop: float
    mbytes: float  # read + written
    call: Callable[[], Any]  # queues one call (its output reused)


def _sizes(dtype: str) -> int:
    return int(np.dtype(dtype).itemsize)


def _ops(gpu: gpud_client.Client, b: int, s: int, dtype: str, rng: np.random.Generator) -> list[Op]:
    c = CONFIGS["all-minilm-l6-v2"]
    h, f, e, layers = c.hidden, c.intermediate, _sizes(dtype), c.layers
    rows = b * s
    ops = gpu.ops

    def t(*shape: int, scale: float = 1.0, kind: str = dtype) -> gpud_client.Tensor:
        return gpu.tensor((scale * rng.standard_normal(shape)).astype(kind))

    x, xf = t(b, s, h), t(b, s, f)
    mask = np.ones((b, s), np.float32)
    mask[1:, s * 3 // 4 :] = 0
    key_mask = gpu.tensor(mask)
    out: list[Op] = []

    def linear(name: str, n: int, k: int, count: int) -> None:
        src = x if k == h else xf
        w, bias = t(n, k, scale=1 / math.sqrt(k)), t(n, scale=0.1)
        y = gpu.empty((b, s, n), dtype)
        flop, mb = 2 * rows * n * k / 1e9, (rows * k + n * k + n + rows * n) * e / 1e6
        out.append(Op(name, count, flop, mb, lambda: ops.matmul(src, w, transpose_w=True, bias=bias, out=y)))

    linear(f"linear {h}->{h}", h, h, 4 * layers)
    linear(f"linear {h}->{f}", f, h, layers)
    linear(f"linear {f}->{h}", h, f, layers)
    heads = (b, s, c.heads, c.head_dim)
    q, k, v = t(*heads), t(*heads), t(*heads)
    a = gpu.empty(heads, dtype)
    attn_flop = 4 * b * c.heads * s * s * c.head_dim / 1e9
    out.append(
        Op(
            "attention",
            layers,
            attn_flop,
            4 * rows * h * e / 1e6,
            lambda: ops.attention(q, k, v, key_mask=key_mask, out=a),
        )
    )
    wn, bn = t(h, scale=0.1), t(h, scale=0.1)
    y = gpu.empty((b, s, h), dtype)
    out.append(
        Op(
            "layernorm",
            2 * layers + 1,
            8 * rows * h / 1e9,
            2 * rows * h * e / 1e6,
            lambda: ops.layernorm(x, wn, bn, 1e-12, out=y),
        )
    )
    yf = gpu.empty((b, s, f), dtype)
    out.append(Op("gelu", layers, 0.0, 2 * rows * f * e / 1e6, lambda: ops.gelu(xf, out=yf)))
    x2 = t(b, s, h)
    out.append(Op("add", 2 * layers, rows * h / 1e9, 3 * rows * h * e / 1e6, lambda: ops.add(x, x2, out=y)))
    pos_table = t(s, h)
    out.append(
        Op("add positions", 1, rows * h / 1e9, (2 * rows + s) * h * e / 1e6, lambda: ops.add(x, pos_table, out=y))
    )
    ids = gpu.tensor(rng.integers(0, c.vocab, (b, s)).astype(np.int64))
    table = t(c.vocab, h, scale=0.5)
    out.append(
        Op(
            "embedding",
            1,
            0.0,
            (rows * 8 + 2 * rows * h * e) / 1e6,
            lambda: ops.embedding(ids, table, dtype=dtype, out=y),
        )
    )
    positions = gpu.tensor(np.arange(s, dtype=np.int32))
    ptable = t(c.max_positions, h)
    yp = gpu.empty((s, h), dtype)
    out.append(
        Op(
            "embedding positions",
            1,
            0.0,
            2 * s * h * e / 1e6,
            lambda: ops.embedding(positions, ptable, dtype=dtype, out=yp),
        )
    )
    mask3 = key_mask.reshape(b, s, 1)
    masked = gpu.empty((b, s, h), "float32")
    out.append(Op("mul mask", 1, rows * h / 1e9, rows * h * (e + 4) / 1e6, lambda: ops.mul(x, mask3, out=masked)))
    summed = gpu.empty((b, h), "float32")
    out.append(Op("sum tokens", 1, rows * h / 1e9, rows * h * 4 / 1e6, lambda: ops.sum(masked, axis=1, out=summed)))
    counts = gpu.empty((b,), "float32")
    out.append(Op("sum mask", 1, rows / 1e9, rows * 4 / 1e6, lambda: ops.sum(key_mask, axis=-1, out=counts)))
    counts2 = counts.reshape(b, 1)
    mean = gpu.empty((b, h), "float32")
    out.append(Op("div", 1, b * h / 1e9, 2 * b * h * 4 / 1e6, lambda: ops.div(summed, counts2, out=mean)))
    unit = gpu.empty((b, h), "float32")
    out.append(Op("normalize", 1, 3 * b * h / 1e9, 2 * b * h * 4 / 1e6, lambda: ops.normalize(mean, 1e-12, out=unit)))
    return out


async def _time(gpu: gpud_client.Client, call: Callable[[], Any], reps: int, pid: int) -> tuple[float, float]:
    """(wall ms, daemon CPU ms) per call: medians over `reps` repetitions of `calls` calls and one sync."""
    call()
    await gpu.sync()
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
        walls.append((time.perf_counter() - t0) / calls)
        cpu1 = _cpu_seconds(pid)
        if cpu0 is not None and cpu1 is not None:
            cpus.append((cpu1 - cpu0) / calls)
    return 1e3 * statistics.median(walls), 1e3 * statistics.median(cpus) if cpus else float("nan")


async def _forward(gpu: gpud_client.Client, b: int, s: int, dtype: str, reps: int, pid: int) -> tuple[float, float]:
    """(wall ms, daemon CPU ms) of one eager forward of a random MiniLM: medians of `reps`."""
    config = CONFIGS["all-minilm-l6-v2"]
    weights = {name: gpu.tensor(a) for name, a in random_weights(config, 0, np.dtype(dtype)).items()}
    encoder = Encoder(gpu, config, weights)
    rng = np.random.default_rng(1)
    ids = rng.integers(0, config.vocab, (b, s)).astype(np.int64)
    mask = np.ones((b, s), np.float32)
    mask[1:, s * 3 // 4 :] = 0
    await encoder.embed(ids, mask)
    walls, cpus = [], []
    for _ in range(reps):
        cpu0, t0 = _cpu_seconds(pid), time.perf_counter()
        await encoder.embed(ids, mask)
        walls.append(time.perf_counter() - t0)
        cpu1 = _cpu_seconds(pid)
        if cpu0 is not None and cpu1 is not None:
            cpus.append(cpu1 - cpu0)
    encoder.free()
    return 1e3 * statistics.median(walls), 1e3 * statistics.median(cpus) if cpus else float("nan")


async def _measure(address: str, pid: int, args: argparse.Namespace) -> dict[str, Any]:
    async with gpud_client.connect(address) as gpu:
        device = gpu.devices[gpu.device] if gpu.devices else {}
        ops = _ops(gpu, args.batch, args.length, args.dtype, np.random.default_rng(0))
        rows = []
        for op in ops:
            if args.ops and not any(op.name.startswith(want) for want in args.ops):
                continue
            wall, cpu = await _time(gpu, op.call, args.reps, pid)
            rows.append({**op._asdict(), "call": None, "wall_ms": wall, "daemon_cpu_ms": cpu})
            print(f"  {op.name}: {wall:.2f} ms wall, {cpu:.2f} ms daemon CPU", flush=True)
        forward = await _forward(gpu, args.batch, args.length, args.dtype, args.reps, pid) if args.forward else None
    return {"device": device, "rows": rows, "forward_ms": forward}


def _print(measured: dict[str, Any], cpu_clock: bool) -> None:
    key = "daemon_cpu_ms" if cpu_clock else "wall_ms"
    rows = measured["rows"]
    total = sum(r[key] * r["per_forward"] for r in rows)
    print(f"\n{measured['device'].get('name', '?')}: ms per call ({'daemon CPU' if cpu_clock else 'wall'})")
    heads = ("calls", "ms/call", "ms/fwd", "share", "GFLOP", "MB", "GFLOP/s", "GB/s")
    print(f"{'op':<22} " + " ".join(f"{h:>{w}}" for h, w in zip(heads, (5, 9, 9, 6, 7, 7, 8, 6), strict=True)))
    for r in sorted(rows, key=lambda r: -r[key] * r["per_forward"]):
        ms = r[key]
        per = ms * r["per_forward"]
        rate = r["gflop"] / (ms * 1e-3) if ms > 0 else float("nan")
        bw = r["mbytes"] / 1e3 / (ms * 1e-3) if ms > 0 else float("nan")
        print(
            f"{r['name']:<22} {r['per_forward']:>5} {ms:9.2f} {per:9.1f} {per / total:6.1%} {r['gflop']:7.3f}"
            f" {r['mbytes']:7.2f} {rate:8.2f} {bw:6.2f}"
        )
    print(f"{'sum over one forward':<22} {'':>5} {'':>9} {total:9.1f}")
    if measured["forward_ms"] is not None:
        wall, cpu = measured["forward_ms"]
        print(f"eager forward measured: {wall:.1f} ms wall, {cpu:.1f} ms daemon CPU")


def main(args: argparse.Namespace) -> int:
    os.environ.setdefault("LP_NUM_THREADS", "0")
    with daemon("webgpu") as (address, proc):
        measured = asyncio.run(_measure(address, proc.pid, args))
    cpu_clock = os.environ["LP_NUM_THREADS"] == "0" and measured["device"].get("adapter_type") == "CPU"
    _print(measured, cpu_clock)
    write_json(
        args.json,
        {
            "benchmark": "wgsl-minilm-ops",
            "LP_NUM_THREADS": os.environ["LP_NUM_THREADS"],
            **{name: value for name, value in vars(args).items() if name != "json"},
            **measured,
        },
    )
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=60)
    parser.add_argument("--dtype", default="float16", choices=("float32", "float16"))
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--ops", type=lambda v: v.split(","), default=None, help="op names (prefixes) to time")
    parser.add_argument("--forward", action="store_true", help="also time whole eager forwards")
    parser.add_argument("--json", type=Path, default=None)
    raise SystemExit(main(parser.parse_args()))

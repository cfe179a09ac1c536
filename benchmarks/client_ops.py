"""The client's CPU cost per call: microseconds spent in the calling thread to queue one op, measured
client-side against a fake daemon (the device computes nothing; see benchmarks.fake_ops).

    python -m benchmarks.client_ops [--calls 2000] [--reps 5]

Per case, `calls` calls are queued back to back and timed (the batches they fill go to the daemon
without waiting), then the session syncs and frees what they made, outside the timing; the least of
`reps` such runs is printed as microseconds of this thread's CPU per call (and of wall time). The
targets (issue #17): <= 2 us per raw `gpu.dispatch`, <= 5 us per op-library call (an output made per
call included). Then the client's side of a MiniLM replay, by stage (benchmarks.client_replay; the daemon
runs with --trace for it), the least of `reps` runs' medians.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import gpud_client
from benchmarks import client_replay, fake_ops, write_json
from gpud_client import nn, u32

Case = Callable[[int], None]  # queues `calls` calls
REPLAYS = 300  # replays per run of the replay's case (benchmarks.client_replay)


def _cases(gpu: gpud_client.Client, kernel: gpud_client.Kernel, tensors: dict[str, Any]) -> dict[str, Case]:
    x, y, z = tensors["x"], tensors["y"], tensors["z"]
    h, w, b = tensors["h"], tensors["w"], tensors["b"]
    q, mask, g, beta = tensors["q"], tensors["mask"], tensors["g"], tensors["beta"]
    s = tensors["s"]  # (32, 2304): picoGPT's q, k and v of 32 tokens side by side
    head = gpu.ops.split(gpu.ops.split(s, 3, axis=-1)[0], 12, axis=-1)[0]  # (32, 64), a view with gaps
    linear = nn.Linear(gpu, w, b)
    norm = nn.LayerNorm(gpu, g, beta)
    ops = gpu.ops
    n = u32(x.shape[0])

    def dispatch(calls: int) -> None:
        for _ in range(calls):
            gpu.dispatch(kernel, 4, [x, y, z, n])

    def add(calls: int) -> None:
        for _ in range(calls):
            ops.add(x, y)

    def add_out(calls: int) -> None:
        for _ in range(calls):
            ops.add(x, y, out=z)

    def add_number(calls: int) -> None:
        for _ in range(calls):
            ops.add(x, 1.0)

    def operator(calls: int) -> None:
        for _ in range(calls):
            x + y  # the operator is what is timed

    def linear_call(calls: int) -> None:
        for _ in range(calls):
            linear(h)

    def layernorm(calls: int) -> None:
        for _ in range(calls):
            norm(h)

    def reshape(calls: int) -> None:
        for _ in range(calls):
            h.reshape(16, 16, 12, 32)

    def attention(calls: int) -> None:
        for _ in range(calls):
            ops.attention(q, q, q, key_mask=mask)

    # numpy's idioms, as a numpy program ported to gpu.ops writes them (gpud.testing.picogpt)
    def mean_kept(calls: int) -> None:
        for _ in range(calls):
            ops.mean(s, axis=-1, keepdims=True)

    def scores(calls: int) -> None:
        for _ in range(calls):
            hq @ hk.T

    def contiguous(calls: int) -> None:
        for _ in range(calls):
            ops.contiguous(head)

    def number(calls: int) -> None:
        for _ in range(calls):
            s * 0.5

    hq, hk = ops.contiguous(head), ops.contiguous(head)

    return {
        "gpu.dispatch (raw, 4 args)": dispatch,
        "ops.add (new output)": add,
        "ops.add (out=)": add_out,
        "ops.add(x, 1.0) (a number)": add_number,
        "x + y (the operator)": operator,
        "nn.Linear 384->384 (B, S, H)": linear_call,
        "nn.LayerNorm (B, S, H)": layernorm,
        "Tensor.reshape (a view)": reshape,
        "ops.attention key_mask (B, S, 12, 32)": attention,
        "ops.mean(x, axis=-1, keepdims=True)": mean_kept,
        "q @ k.T (a transposed operand)": scores,
        "ops.contiguous (a split head)": contiguous,
        "x * 0.5 (a number)": number,
    }


async def _measure(gpu: gpud_client.Client, case: Case, calls: int, reps: int) -> tuple[float, float]:
    """(CPU, wall) microseconds per call: the least over `reps` runs of `calls` calls. CPU is this
    thread's (time.thread_time): what the calls cost, whatever else the machine runs (the daemon
    shares its cores); wall adds the time this thread waited for a core."""
    cpu, wall = [], []
    for rep in range(reps + 1):
        async with gpu.scope():
            c0, t0 = time.thread_time(), time.perf_counter()
            case(calls)
            c1, t1 = time.thread_time(), time.perf_counter()
            await gpu.sync()
        if rep:  # the first run warms the caches and registers the kernels
            cpu.append((c1 - c0) / calls * 1e6)
            wall.append((t1 - t0) / calls * 1e6)
    return min(cpu), min(wall)


async def run(address: str, calls: int, reps: int) -> dict[str, float]:
    async with gpud_client.connect(address) as gpu:
        kernel = await gpu.kernel("fake:add", "add") if gpu.backend == "fake" else None
        rng = np.random.default_rng(0)
        arrays = {
            "x": rng.standard_normal(256, np.float32),
            "y": rng.standard_normal(256, np.float32),
            "z": np.zeros(256, np.float32),
            "h": rng.standard_normal((16, 16, 384), np.float32).astype(np.float16),
            "w": rng.standard_normal((384, 384), np.float32).astype(np.float16),
            "b": rng.standard_normal(384, np.float32).astype(np.float16),
            "g": np.ones(384, np.float16),
            "beta": np.zeros(384, np.float16),
            "q": rng.standard_normal((16, 16, 12, 32), np.float32).astype(np.float16),
            "mask": np.ones((16, 16), np.int64),
            "s": rng.standard_normal((32, 2304), np.float32),
        }
        tensors = {name: gpu.tensor(a) for name, a in arrays.items()}
        results = {}
        for name, case in _cases(gpu, kernel, tensors).items():  # type: ignore[arg-type]
            if kernel is None and name.startswith("gpu.dispatch"):
                continue
            cpu, wall = await _measure(gpu, case, calls, reps)
            results[name] = cpu
            print(f"  {name:<40} {cpu:8.2f} us per call   (wall {wall:.2f})", flush=True)
    results.update(await client_replay.run(address, REPLAYS, reps))  # a session of its own
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.client_ops", description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls per timed run")
    parser.add_argument("--reps", type=int, default=5, help="timed runs per case (the least is the result)")
    parser.add_argument("--backend", default="fake", help="fake (no-op op library) or a real backend")
    parser.add_argument("--json", type=Path, help="write the results (us of CPU per call, by case) here")
    args = parser.parse_args(argv)
    print(f"client CPU per call ({args.backend} daemon, {args.calls} calls a run, least of {args.reps}):")
    with fake_ops.daemon(args.backend, extra_args=("--trace",)) as address:  # (the replay's stages)
        results = asyncio.run(run(address, args.calls, args.reps))
    meta = {"calls": args.calls, "reps": args.reps, "backend": args.backend, "unit": "us of client CPU per call"}
    write_json(args.json, {"benchmark": "client_ops", "meta": meta, "results": results})


if __name__ == "__main__":
    main()

"""`gpud bench clients`: K client processes sharing one daemon and one resident input.

Each client opens the resident tensor `bench/w` read-only and, as fast as it can, runs steps of a
dependent chain `x <- x * a + w` followed by a readback that it checks against numpy. Reported per
K: aggregate and per-client dispatches per second, the spread between clients (fairness), and the
device memory in use (the resident input is held once however many clients open it).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import statistics
import time
from typing import Any

import numpy as np

import gpud_client
from benchmarks import write_json
from gpud.testing import workloads as kernels
from gpud.testing.spawn import daemon

N = 4096
CHAIN = 50
A = 0.5


def _expected(x0: np.ndarray, w: np.ndarray) -> np.ndarray:
    x = x0
    for _ in range(CHAIN):
        x = (x * np.float32(A) + w).astype(np.float32)
    return x


async def _client(address: str, start_at: float, seconds: float, seed: int) -> dict[str, Any]:
    async with gpud_client.connect(address) as gpu:
        source, options = kernels.axpw_source(gpu.backend)
        k = await gpu.kernel(source, "axpw", **options)  # type: ignore[arg-type]
        w_tensor = await gpu.open("bench/w")
        w = await w_tensor.numpy()
        rng = np.random.default_rng(seed)
        x0 = rng.standard_normal(N).astype(np.float32)
        want = _expected(x0, w)
        bufs = [gpu.tensor(x0), gpu.empty(N)]
        n32 = gpud_client.u32(N)
        await asyncio.sleep(max(0.0, start_at - time.time()))
        steps = 0
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            bufs[0].upload(x0)
            for i in range(CHAIN):
                gpu.dispatch(k, kernels.groups(N), [bufs[i % 2], w_tensor, bufs[(i + 1) % 2], A, n32])
            out = await bufs[CHAIN % 2].numpy()
            if not np.allclose(out, want, rtol=1e-4, atol=1e-5):
                raise AssertionError(f"client {seed}: wrong result")
            steps += 1
        elapsed = time.perf_counter() - t0
        return {"client": seed, "steps": steps, "dispatches_per_s": steps * CHAIN / elapsed}


def _client_process(address: str, start_at: float, seconds: float, seed: int, results: Any) -> None:
    results.put(asyncio.run(_client(address, start_at, seconds, seed)))


async def _publish(address: str) -> str:
    """Publish the shared input; it outlives this session, as resident tensors do."""
    async with gpud_client.connect(address) as gpu:
        gpu.publish(gpu.tensor(np.linspace(-1, 1, N, dtype=np.float32)), "bench/w", mode="ro")
        await gpu.flush()
        return gpu.backend


async def _unpublish(address: str) -> None:
    async with gpud_client.connect(address) as gpu:
        gpu.unpublish("bench/w")
        await gpu.flush()


def _run_k(address: str, k: int, seconds: float) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    start_at = time.time() + 3.0  # time for every process to connect and compile first
    procs = [ctx.Process(target=_client_process, args=(address, start_at, seconds, i, results)) for i in range(k)]
    for p in procs:
        p.start()
    per_client = [results.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join()
    rates = [r["dispatches_per_s"] for r in per_client]
    mean = statistics.fmean(rates)
    return {
        "clients": k,
        "aggregate_dispatches_per_s": sum(rates),
        "per_client_dispatches_per_s": rates,
        "max_deviation_from_mean_pct": max(abs(r - mean) / mean * 100 for r in rates),
    }


async def _memory(address: str) -> int:
    async with gpud_client.connect(address) as gpu:
        stats = await gpu.stats()
        return int(stats["device"]["memory_in_use"])


def main(args: argparse.Namespace) -> int:
    counts = [int(c) for c in args.clients.split(",")]
    seconds = 1.0 if args.quick else args.seconds
    runs = []
    with daemon(args.backend) as (address, _proc):
        backend = asyncio.run(_publish(address))
        print(f"backend {backend}; each client: steps of {CHAIN} dependent dispatches on {N} floats + a readback")
        print(f"{'clients':>7} {'aggregate/s':>12} {'per client/s (min..max)':>26} {'spread':>8} {'device MiB':>10}")
        for k in counts:
            run = _run_k(address, k, seconds)
            run["device_memory_bytes_after"] = asyncio.run(_memory(address))
            rates = run["per_client_dispatches_per_s"]
            print(
                f"{k:>7} {run['aggregate_dispatches_per_s']:>12.0f} {min(rates):>12.0f} .. {max(rates):<11.0f}"
                f" {run['max_deviation_from_mean_pct']:>7.1f}% {run['device_memory_bytes_after'] / 2**20:>10.2f}"
            )
            runs.append(run)
        asyncio.run(_unpublish(address))
    write_json(
        args.json,
        {"benchmark": "clients", "backend": backend, "n": N, "chain": CHAIN, "seconds": seconds, "runs": runs},
    )
    return 0

"""`gpud bench replay`: a whole step as one replay graph, against the other ways to run it, in one run.

The step: upload x (4,096 floats), 255 dependent `axpb` dispatches ping-ponging two intermediates,
one more that writes the first element into a 1-element output, read those 4 bytes back (256
dispatches). Ways on cuda: (a) gpud replay, (b) gpud coalesced (the same ops sent each step),
(c) PyTorch eager, (d) PyTorch CUDA graph, (e) a cuda-python `cuLaunchKernel` loop, in process.
Also a decode-like step (one 896-float input, 64 dispatches, one 896-float output) and the round
trip of an empty replay (the floor under every step), and the replay's stages from `--trace`.
On webgpu: replay, coalesced, and in-process wgpu with one submit per dispatch.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import Callable
from typing import Any

import numpy as np

import gpud_client
from benchmarks import percentiles_us, time_async, time_sync, write_json
from gpud.backends import resolve
from gpud.testing import workloads as kernels
from gpud.testing.spawn import daemon

N = 4096
STEP = 256
A, B = kernels.A, kernels.B


def reference(x: np.ndarray, dispatches: int) -> np.ndarray:
    return kernels.chain_reference(x, dispatches)


async def _gpud_ways(address: str, x0: np.ndarray, reps: int, n: int, chain: int, ring: bool = False) -> dict[str, Any]:
    """(a) replay and (b) coalesced through one gpud (over the shared-memory ring with `ring`); results
    checked against numpy."""
    async with gpud_client.connect(address, ring=ring) as gpu:
        source, options = kernels.axpb_source(gpu.backend)
        k = await gpu.kernel(source, "axpb", **options)  # type: ignore[arg-type]
        n32 = gpud_client.u32(n)
        # the replay graph
        g = gpu.graph(f"bench-{n}-{chain}")
        x = g.input("x", (n,), "float32")
        t = [g.empty((n,)), g.empty((n,))]
        out = g.empty((1,)) if n > 1 and chain == STEP else g.empty((n,))
        steps = chain - 1 if out.shape == (1,) else chain
        src: Any = x
        for i in range(steps):
            g.dispatch(k, kernels.groups(n), [src, t[i % 2], A, B, n32])
            src = t[i % 2]
        if out.shape == (1,):
            g.dispatch(k, 1, [src, out, A, B, gpud_client.u32(1)])
        else:
            g.copy(src, out)
        g.output("y", out)
        step = await g.build()
        want = reference(x0, chain)[: out.shape[0]]

        async def replay() -> np.ndarray:
            result: np.ndarray = (await step.replay(x=x0))["y"]
            return result

        got = await replay()
        assert np.allclose(got, want, rtol=1e-3, atol=1e-4), "gpud replay computed a wrong result"
        replayed = await time_async(replay, reps, warmup=20)
        traces = []
        for _ in range(min(reps, 200)):
            await replay()
            if gpu.last_trace is not None:
                traces.append(gpu.last_trace)

        # the same ops, sent every step
        bufs = [gpu.empty(n), gpu.empty(n)]
        tail = gpu.empty(out.shape[0])

        async def coalesced() -> np.ndarray:
            bufs[0].upload(x0)
            for i in range(steps):
                gpu.dispatch(k, kernels.groups(n), [bufs[i % 2], bufs[(i + 1) % 2], A, B, n32])
            if out.shape == (1,):
                gpu.dispatch(k, 1, [bufs[steps % 2], tail, A, B, gpud_client.u32(1)])
                result: np.ndarray = await tail.numpy()
            else:
                result = await bufs[steps % 2].numpy()
            return result

        got = await coalesced()
        assert np.allclose(got, want, rtol=1e-3, atol=1e-4), "gpud coalesced computed a wrong result"
        eager = await time_async(coalesced, reps, warmup=5)

        # the empty replay: the round trip under every step
        empty = await gpu.graph(f"empty-{n}-{chain}").build()

        async def nothing() -> None:
            await empty.replay()

        floor = await time_async(nothing, max(reps, 500), warmup=50)
        stats = await gpu.stats()
    return {
        "replay": replayed,
        "coalesced": eager,
        "empty_replay": floor,
        "stages_median_us": gpud_client.Trace.median_stages_us(traces),
        "device_stats": {k: v for k, v in stats["device"].items() if not isinstance(v, dict)},
    }


def _torch(x0: np.ndarray, chain: int, n: int) -> tuple[Callable[[], np.ndarray], Callable[[], np.ndarray]]:
    import torch

    x = torch.empty(n, device="cuda")
    bufs = [torch.empty(n, device="cuda") for _ in range(2)]
    b = torch.tensor(B, device="cuda")
    host = torch.from_numpy(x0)
    out_n = 1 if chain == STEP and n > 1 else n

    def ops() -> torch.Tensor:
        src = x
        for i in range(chain - (1 if out_n == 1 else 0)):
            torch.add(b, src, alpha=A, out=bufs[i % 2])
            src = bufs[i % 2]
        if out_n == 1:
            return torch.add(b, src[:1], alpha=A)
        return src

    def eager() -> np.ndarray:
        x.copy_(host, non_blocking=False)
        result: np.ndarray = ops().cpu().numpy()
        return result

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        ops()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = ops()

    def graphed() -> np.ndarray:
        x.copy_(host, non_blocking=False)
        graph.replay()
        result: np.ndarray = static_out.cpu().numpy()
        return result

    return eager, graphed


def _cuda_python(x0: np.ndarray, chain: int, n: int) -> Callable[[], np.ndarray]:
    from benchmarks.cuda import CudaPython

    local = CudaPython()
    assert n == 4096, "the cuda-python loop runs the 4,096-float step"

    def run() -> np.ndarray:
        return local.chain(x0, chain)[:1]

    return run


def _wgpu(local: Any, x0: np.ndarray, chain: int, one_pass: bool) -> Callable[[], np.ndarray]:
    def run() -> np.ndarray:
        result: np.ndarray = local.run(x0, chain, one_pass=one_pass)[:1]
        return result

    return run


def _in_process(way: Callable[[], np.ndarray], reps: int) -> list[float]:
    return time_sync(way, reps, warmup=5)


def _us(samples: list[float]) -> dict[str, float]:
    return percentiles_us(samples)


def main(args: argparse.Namespace) -> int:
    os.environ.setdefault("LP_NUM_THREADS", "0")  # lavapipe: inline execution (see bench webgpu)
    backend = resolve(args.backend)
    reps = 20 if args.quick else 200
    rng = np.random.default_rng(0)
    results: dict[str, Any] = {"benchmark": "replay", "backend": backend, "reps": reps}
    steps = {"step256": (N, STEP), "decode_like": (896, 64)}
    with daemon(backend, extra_args=("--trace",)) as (address, _proc):
        for name, (n, chain) in steps.items():
            x0 = rng.standard_normal(n).astype(np.float32)
            measured = asyncio.run(_gpud_ways(address, x0, reps, n, chain))
            row: dict[str, Any] = {
                "n": n,
                "dispatches": chain,
                "gpud_replay": _us(measured["replay"]),
                "gpud_coalesced": _us(measured["coalesced"]),
                "gpud_replay_ring": _us(asyncio.run(_gpud_ways(address, x0, reps, n, chain, ring=True))["replay"]),
                "empty_replay_round_trip": _us(measured["empty_replay"]),
                "replay_stages_median_us": measured["stages_median_us"],
                "daemon": measured["device_stats"],
            }
            if backend == "cuda":
                try:
                    eager, graphed = _torch(x0, chain, n)
                    row["torch_eager"] = _us(_in_process(eager, reps))
                    row["torch_cuda_graph"] = _us(_in_process(graphed, reps))
                except Exception as exc:  # torch missing or failing: say so
                    row["torch_skipped"] = repr(exc)
                if n == N:
                    row["cuda_python_loop"] = _us(_in_process(_cuda_python(x0, chain, n), reps))
            else:
                from benchmarks.webgpu import InProcess

                local = InProcess(n)
                row["wgpu_submit_per_dispatch"] = _us(_in_process(_wgpu(local, x0, chain, False), max(5, reps // 10)))
                row["wgpu_one_pass"] = _us(_in_process(_wgpu(local, x0, chain, True), reps))
            results[name] = row
            _print(name, row)
    results["empty_replay_polling"] = _polling(backend, reps)
    write_json(args.json, results)
    return 0


def _polling(backend: str, reps: int) -> dict[str, Any]:
    """The empty replay's round trip when the daemon and the client poll before sleeping."""
    floors: dict[str, Any] = {}
    for poll in (0, 50, 200):
        with daemon(backend, extra_args=("--busy-poll-us", str(poll))) as (address, _proc):
            floors[f"poll_{poll}us"] = _us(asyncio.run(_empty(address, max(reps, 500), poll)))
    print("\nempty replay round trip with both sides polling (us):")
    for name, p in floors.items():
        print(f"  {name:<12} p50 {p['p50']:8.1f}  p99 {p['p99']:8.1f}")
    return floors


async def _empty(address: str, reps: int, spin_us: float) -> list[float]:
    async with gpud_client.connect(address, spin_us=spin_us) as gpu:
        empty = await gpu.graph("empty").build()

        async def nothing() -> None:
            await empty.replay()

        return await time_async(nothing, reps, warmup=50)


def _print(name: str, row: dict[str, Any]) -> None:
    print(f"\n{name}: {row['dispatches']} dependent dispatches on {row['n']} floats, per step (us)")
    replay = row["gpud_replay"]["p50"]
    ways = ["gpud_replay", "gpud_replay_ring", "gpud_coalesced", "torch_eager", "torch_cuda_graph", "cuda_python_loop"]
    ways += ["wgpu_submit_per_dispatch", "wgpu_one_pass", "empty_replay_round_trip"]
    for way in ways:
        if way in row:
            p = row[way]
            ratio = p["p50"] / replay
            print(f"  {way:<26} p50 {p['p50']:9.1f}  p99 {p['p99']:9.1f}   {ratio:5.2f}x the replay's time")
    if "torch_cuda_graph" in row:
        row["replay_vs_torch_cuda_graph"] = replay / row["torch_cuda_graph"]["p50"]
        row["torch_eager_vs_replay"] = row["torch_eager"]["p50"] / replay
        row["ring_replay_vs_torch_cuda_graph"] = row["gpud_replay_ring"]["p50"] / row["torch_cuda_graph"]["p50"]
        print(f"  replay / torch CUDA graph = {row['replay_vs_torch_cuda_graph']:.2f} (target <= 1.3)")
        print(f"  replay over the ring / torch CUDA graph = {row['ring_replay_vs_torch_cuda_graph']:.2f}")
        print(f"  torch eager / replay = {row['torch_eager_vs_replay']:.2f} (target >= 5)")
    stages = ", ".join(f"{k} {v:.1f}" for k, v in row["replay_stages_median_us"].items())
    print(f"  replay stages, median us: {stages}")

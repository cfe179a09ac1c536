"""`gpud bench cuda`: gpud against the in-process ways to launch the same kernel, in one run.

1. throughput: a chain of dependent `axpb` dispatches (each reads the previous output), then one
   readback: cuda-python `cuLaunchKernel` loop, CuPy RawKernel, PyTorch eager (one fused op per
   step), PyTorch CUDA graph replay, and a client through gpud;
2. latency: one dispatch plus a 4-byte readback, p50 and p99, in process and through gpud.

CuPy and PyTorch are optional: a way whose package is missing is reported as skipped.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import time
from functools import partial
from typing import Any

import numpy as np

import gpud_client
from benchmarks import per_item_us, percentiles_us, print_table, time_async, time_sync, write_json
from gpud.testing import workloads as kernels
from gpud.testing.spawn import daemon

A, B = kernels.A, kernels.B
N = 4096


def _check(result: Any) -> Any:
    err, *rest = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise RuntimeError(f"CUDA error {err}")
    return rest[0] if len(rest) == 1 else rest


class CudaPython:
    """The in-process floor: NVRTC + cuLaunchKernel from Python, args packed once per launch."""

    def __init__(self) -> None:
        from cuda.bindings import driver as cu
        from cuda.bindings import nvrtc

        self.cu = cu
        _check(cu.cuInit(0))
        device = _check(cu.cuDeviceGet(0))
        self.ctx = _check(cu.cuDevicePrimaryCtxRetain(device))
        _check(cu.cuCtxSetCurrent(self.ctx))
        major = _check(
            cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device)
        )
        minor = _check(
            cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device)
        )
        self.name = _check(cu.cuDeviceGetName(64, device)).split(b"\0")[0].decode()
        prog = _check(nvrtc.nvrtcCreateProgram(kernels.AXPB_CUDA.encode(), b"axpb.cu", 0, [], []))
        _check(nvrtc.nvrtcCompileProgram(prog, 1, [f"--gpu-architecture=sm_{major}{minor}".encode()]))
        size = _check(nvrtc.nvrtcGetCUBINSize(prog))
        cubin = b" " * size
        _check(nvrtc.nvrtcGetCUBIN(prog, cubin))
        self.module = _check(cu.cuModuleLoadData(cubin))
        self.func = _check(cu.cuModuleGetFunction(self.module, b"axpb"))
        self.stream = _check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING))
        self.bufs = [_check(cu.cuMemAlloc(N * 4)) for _ in range(2)]
        self.host = np.zeros(N, np.float32)

    def upload(self, x0: np.ndarray) -> None:
        _check(self.cu.cuMemcpyHtoD(self.bufs[0], x0.ctypes.data, x0.nbytes))

    def launch(self, src: int, dst: int) -> None:
        cu = self.cu
        params = (
            (self.bufs[src], self.bufs[dst], A, B, N),
            (None, None, ctypes.c_float, ctypes.c_float, ctypes.c_uint),
        )
        _check(cu.cuLaunchKernel(self.func, kernels.groups(N), 1, 1, kernels.BLOCK, 1, 1, 0, self.stream, params, 0))

    def chain(self, x0: np.ndarray, chain: int) -> np.ndarray:
        self.upload(x0)
        for i in range(chain):
            self.launch(i % 2, (i + 1) % 2)
        _check(self.cu.cuMemcpyDtoHAsync(self.host.ctypes.data, self.bufs[chain % 2], N * 4, self.stream))
        _check(self.cu.cuStreamSynchronize(self.stream))
        return self.host.copy()

    def round_trip(self) -> float:
        t0 = time.perf_counter()
        self.launch(0, 1)
        _check(self.cu.cuMemcpyDtoHAsync(self.host.ctypes.data, self.bufs[1], 4, self.stream))
        _check(self.cu.cuStreamSynchronize(self.stream))
        return time.perf_counter() - t0

    def close(self) -> None:
        for buf in self.bufs:
            self.cu.cuMemFree(buf)
        self.cu.cuModuleUnload(self.module)
        self.cu.cuStreamDestroy(self.stream)


def _cupy_chain() -> Any:
    import cupy as cp

    kernel = cp.RawKernel(kernels.AXPB_CUDA, "axpb")
    bufs = [cp.empty(N, cp.float32) for _ in range(2)]

    def run(x0: np.ndarray, chain: int) -> np.ndarray:
        bufs[0].set(x0)
        for i in range(chain):
            kernel(
                (kernels.groups(N),),
                (kernels.BLOCK,),
                (bufs[i % 2], bufs[(i + 1) % 2], cp.float32(A), cp.float32(B), cp.uint32(N)),
            )
        out: np.ndarray = bufs[chain % 2].get()
        return out

    return run


def _torch_ways() -> tuple[Any, Any]:
    import torch

    bufs = [torch.empty(N, device="cuda") for _ in range(2)]
    b = torch.tensor(B, device="cuda")

    def eager(x0: np.ndarray, chain: int) -> np.ndarray:
        bufs[0].copy_(torch.from_numpy(x0))
        for i in range(chain):
            torch.add(b, bufs[i % 2], alpha=A, out=bufs[(i + 1) % 2])  # one kernel: b + A * x
        out: np.ndarray = bufs[chain % 2].cpu().numpy()
        return out

    graphs: dict[int, Any] = {}

    def graphed(x0: np.ndarray, chain: int) -> np.ndarray:
        if chain not in graphs:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                eager(x0, 2)  # warm-up outside capture
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for i in range(chain):
                    torch.add(b, bufs[i % 2], alpha=A, out=bufs[(i + 1) % 2])
            graphs[chain] = graph
        bufs[0].copy_(torch.from_numpy(x0))
        graphs[chain].replay()
        out: np.ndarray = bufs[chain % 2].cpu().numpy()
        return out

    return eager, graphed


async def _gpud_chain(address: str, x0: np.ndarray, chain: int, reps: int) -> dict[str, Any]:
    """The chain through gpud, with the CPU time each side spent per dispatch."""
    async with gpud_client.connect(address) as gpu:
        k = await gpu.kernel(kernels.AXPB_CUDA, "axpb", block=(kernels.BLOCK, 1, 1))
        bufs = [gpu.empty(N), gpu.empty(N)]

        async def step() -> np.ndarray:
            return await kernels.run_chain(gpu, k, bufs, x0, chain)

        out = await step()
        before = (await gpu.stats())["process"]["cpu_s"], time.process_time()
        samples = await time_async(step, reps)
        after = (await gpu.stats())["process"]["cpu_s"], time.process_time()
        dispatches = (reps + 2) * chain  # time_async warms up twice
        cpu = {
            "daemon_cpu_us_per_dispatch": (after[0] - before[0]) / dispatches * 1e6,
            "client_cpu_us_per_dispatch": (after[1] - before[1]) / dispatches * 1e6,
        }
        stats = await gpu.stats()
        return {"chain": samples, "out": out, "cpu": cpu, "stats": stats["device"]}


async def _gpud_latency(address: str, samples: int, spin_us: float) -> dict[str, Any]:
    """Dispatch + 4-byte readback round trips, with the daemon's stamps (it runs with --trace)."""
    async with gpud_client.connect(address, spin_us=spin_us) as gpu:
        k = await gpu.kernel(kernels.AXPB_CUDA, "axpb", block=(kernels.BLOCK, 1, 1))
        one = [gpu.tensor(np.ones(1, np.float32)), gpu.empty(1)]
        traces: list[gpud_client.Trace] = []

        async def round_trip() -> None:
            gpu.dispatch(k, 1, [one[0], one[1], A, B, gpud_client.u32(1)])
            await one[1].numpy()
            if gpu.last_trace is not None:
                traces.append(gpu.last_trace)

        totals = await time_async(round_trip, samples, warmup=100)
        traces = traces[-samples:]
        return {"total": percentiles_us(totals), "stages_median_us": gpud_client.Trace.median_stages_us(traces)}


def main(args: argparse.Namespace) -> int:
    chain = 1000 if args.quick else 10_000
    reps = 3 if args.quick else 7
    rt_samples = 200 if args.quick else 2000
    x0 = np.random.default_rng(0).standard_normal(N).astype(np.float32)
    ref = kernels.chain_reference(x0, chain)
    local = CudaPython()
    print(f"device: {local.name}")
    print(f"workload: {chain} dependent axpb dispatches on {N} floats, then one readback; {reps} repetitions")
    ways: dict[str, Any] = {"cuda_python_loop": local.chain}
    skipped: dict[str, str] = {}
    try:
        ways["cupy_rawkernel"] = _cupy_chain()
    except Exception as exc:
        skipped["cupy_rawkernel"] = repr(exc)
    try:
        ways["torch_eager"], ways["torch_cuda_graph"] = _torch_ways()
    except Exception as exc:
        skipped["torch_eager"] = skipped["torch_cuda_graph"] = repr(exc)

    timings: dict[str, dict[str, float]] = {}
    for name, run in ways.items():
        out = run(x0, chain)
        if not np.allclose(out, ref, rtol=1e-3, atol=1e-4):
            raise AssertionError(f"{name} computed a wrong result")
        timings[name] = per_item_us(time_sync(partial(run, x0, chain), reps), chain)

    with daemon("cuda") as (address, _proc):
        measured = asyncio.run(_gpud_chain(address, x0, chain, reps))
    if not np.allclose(measured["out"], ref, rtol=1e-3, atol=1e-4):
        raise AssertionError("gpud computed a wrong result")
    timings["gpud_client"] = per_item_us(measured["chain"], chain)
    latency_modes = {
        "gpud_client": ((), 0.0),
        "gpud_client_busy_poll_100us": (("--busy-poll-us", "100"), 100.0),
        "gpud_client_busy_poll_1ms": (("--busy-poll-us", "1000"), 1000.0),
    }
    gpud_latency = {}
    for name, (daemon_args, spin_us) in latency_modes.items():
        with daemon("cuda", extra_args=("--trace", *daemon_args)) as (address, _proc):
            gpud_latency[name] = asyncio.run(_gpud_latency(address, rt_samples, spin_us))

    loop_us = timings["cuda_python_loop"]["median"]
    eager_us = timings.get("torch_eager", {}).get("median")
    rows = []
    for name, t in timings.items():
        ratio = f"{loop_us / t['median']:5.2f}x vs cuda-python loop"
        if eager_us:
            ratio += f", {eager_us / t['median']:5.2f}x vs torch eager"
        rows.append((name, t["median"], ratio))
    print_table("us per dispatch in a dependent chain (median; higher ratio = faster)", rows)

    cpu = measured["cpu"]
    print(
        f"  where a gpud dispatch goes: daemon CPU {cpu['daemon_cpu_us_per_dispatch']:.2f} us,"
        f" client CPU {cpu['client_cpu_us_per_dispatch']:.2f} us (in parallel processes)"
    )

    in_process = [local.round_trip() for _ in range(rt_samples)]
    latency = {"in_process_cuda_python": percentiles_us(in_process)}
    latency.update({name: result["total"] for name, result in gpud_latency.items()})
    print("\ndispatch + 4-byte readback round trip")
    for name, p in latency.items():
        print(f"  {name:<28} p50 {p['p50']:8.1f} us   p99 {p['p99']:8.1f} us")
    for name, result in gpud_latency.items():
        stages = ", ".join(f"{stage} {us:.1f}" for stage, us in result["stages_median_us"].items())
        print(f"  {name} median stages (us): {stages}")
    local.close()

    results: dict[str, Any] = {
        "benchmark": "cuda-chain",
        "device": local.name,
        "n": N,
        "chain": chain,
        "reps": reps,
        "us_per_dispatch": timings,
        "gpud_cpu_per_dispatch": cpu,
        "skipped": skipped,
        "round_trip_us": latency,
        "round_trip_stages_median_us": {name: r["stages_median_us"] for name, r in gpud_latency.items()},
        "gpud_vs_cuda_python_loop": loop_us / timings["gpud_client"]["median"],
        "gpud_vs_torch_eager": (eager_us / timings["gpud_client"]["median"]) if eager_us else None,
        "daemon_stats": measured["stats"],
    }
    write_json(args.json, results)
    return 0

"""Launch-path overhead of the CUDA backend against raw cuLaunchKernel, in one process.

    python3 benchmarks/cuda_launch.py [--launches 10000] [--json out.json]

Prints µs per launch for: raw cuLaunchKernel (pre-built void** array / (values, types) tuple /
no arguments), `CudaBackend.dispatch` of the same 4-argument kernel, and the round trip of one
dispatch plus a 4-byte readback (with blocking-sync and with spinning completion events), split
into: encoding, waking the completion thread, the GPU wait, waking the loop, resuming the awaiter.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from cuda.bindings import driver as cu

from gpud.backends.base import Arg, Done
from gpud.backends.cuda import CudaBackend, _check
from gpud.config import Config
from gpud_protocol import ArgKind, KernelOptions

SOURCE = """
extern "C" __global__ void scale(const float* x, float* y, float a, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i];
}
extern "C" __global__ void empty() {}
"""
N = 256


def per_launch_us(
    fn: Callable[[], None],
    launches: int,
    sync: Callable[[], None],
    repeats: int = 3,
    finish: Callable[[], None] | None = None,
) -> float:
    """Best of `repeats` of `launches` back-to-back calls (host time to enqueue), µs per call.

    `finish` runs inside the timed window: the backend records launches and issues them at flush."""
    best = float("inf")
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        for _ in range(launches):
            fn()
        if finish is not None:
            finish()
        best = min(best, time.perf_counter() - start)
        sync()
    return best / launches * 1e6


async def launch_overhead(launches: int, cache_dir: str) -> dict[str, float]:
    # graph_cache_size=0: measure eager launches, not graph replays of the repeated run
    b = CudaBackend(Config(cache_dir=Path(cache_dir), graph_cache_size=0), on_fatal=lambda _e: None)
    k = b.kernel(SOURCE, "scale", KernelOptions((N, 1, 1), (), None))
    x, y = b.alloc(N * 4), b.alloc(N * 4)
    args: list[Arg] = [x, y, (ArgKind.F32, 2.0), (ArgKind.U32, N)]
    stream = b._stream
    function = k.native.function
    empty = _check(cu.cuModuleGetFunction(b._modules[k.native.module_id], b"empty"))

    def sync() -> None:
        b.flush()
        _check(cu.cuStreamSynchronize(stream))

    values = [ctypes.c_void_p(x.native), ctypes.c_void_p(y.native), ctypes.c_float(2.0), ctypes.c_uint32(N)]
    pointers = (ctypes.c_void_p * 4)(*(ctypes.addressof(v) for v in values))
    address = ctypes.addressof(pointers)
    typed = ((x.native, y.native, 2.0, N), (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_float, ctypes.c_uint32))

    def raw_pointer_array() -> None:
        cu.cuLaunchKernel(function, 1, 1, 1, N, 1, 1, 0, stream, address, 0)

    def raw_tuple() -> None:
        cu.cuLaunchKernel(function, 1, 1, 1, N, 1, 1, 0, stream, typed, 0)

    def raw_empty() -> None:
        cu.cuLaunchKernel(empty, 1, 1, 1, 32, 1, 1, 0, stream, 0, 0)

    def backend_dispatch() -> None:
        b.dispatch(k, (1, 1, 1), args)

    prepared = b.prepare(k, (1, 1, 1), args)

    def backend_prepared() -> None:  # the path of a dispatch a session has seen before
        b.dispatch_prepared(prepared)

    results = {
        "raw_cuLaunchKernel_void_pp_us": per_launch_us(raw_pointer_array, launches, sync),
        "raw_cuLaunchKernel_tuple_us": per_launch_us(raw_tuple, launches, sync),
        "raw_cuLaunchKernel_empty_kernel_us": per_launch_us(raw_empty, launches, sync),
        "backend_dispatch_us": per_launch_us(backend_dispatch, launches, sync, finish=b.flush),
        "backend_prepared_dispatch_us": per_launch_us(backend_prepared, launches, sync, finish=b.flush),
    }
    await b.synchronize()
    results["backend_overhead_us"] = results["backend_dispatch_us"] - results["raw_cuLaunchKernel_void_pp_us"]
    b.release(x)
    b.release(y)
    await b.close()
    return results


class _Timed(CudaBackend):
    """Timestamps the steps of a completion: submit, event wait returned (completion thread), loop callback."""

    marks: ClassVar[dict[str, float]] = {}

    def _submit(self, done: Done) -> None:
        self.marks["submitted"] = time.perf_counter()
        super()._submit(done)

    def _wait_events(self) -> None:
        cu.cuCtxSetCurrent(self._context)
        while (item := self._completions.get()) is not None:
            self.marks["thread_woke"] = time.perf_counter()
            _check(cu.cuEventSynchronize(item[0]))
            self.marks["event_returned"] = time.perf_counter()
            self._loop.call_soon_threadsafe(self._event_done, item, None)

    def _event_done(self, item: Any, error: Any) -> None:
        self.marks["loop_callback"] = time.perf_counter()
        super()._event_done(item, error)

    def _finished_within_spin(self, event: Any) -> bool:
        return False  # always through the completion thread: that is the path broken down here


async def round_trip(blocking: bool, iterations: int, cache_dir: str) -> dict[str, float]:
    """dispatch + 4-byte readback + flush + await, in process: p50/p99 µs and where the time goes (p50s)."""
    _Timed.blocking_sync = blocking
    b = _Timed(Config(cache_dir=Path(cache_dir)), on_fatal=lambda _e: None)
    k = b.kernel(SOURCE, "scale", KernelOptions((N, 1, 1), (), None))
    x, y = b.alloc(4), b.alloc(4)
    args: list[Arg] = [x, y, (ArgKind.F32, 2.0), (ArgKind.U32, 1)]
    names = ("total", "encode", "to_thread", "gpu_wait", "to_loop", "resume")
    steps: dict[str, list[float]] = {name: [] for name in names}
    for i in range(iterations + 200):
        start = time.perf_counter()
        b.dispatch(k, (1, 1, 1), args)
        future = await b.download(y)
        b.flush()
        await future
        end = time.perf_counter()
        if i < 200:  # warm-up
            continue
        m = b.marks
        steps["total"].append(end - start)
        steps["encode"].append(m["submitted"] - start)
        steps["to_thread"].append(max(0.0, m["thread_woke"] - m["submitted"]))
        steps["gpu_wait"].append(m["event_returned"] - max(m["thread_woke"], m["submitted"]))
        steps["to_loop"].append(m["loop_callback"] - m["event_returned"])
        steps["resume"].append(end - m["loop_callback"])
    b.release(x)
    b.release(y)
    await b.close()
    result = {f"{name}_p50_us": statistics.median(v) * 1e6 for name, v in steps.items()}
    result["total_p99_us"] = statistics.quantiles(steps["total"], n=100)[98] * 1e6
    return result


async def main(launches: int, json_path: str | None) -> None:
    with tempfile.TemporaryDirectory() as cache_dir:
        results: dict[str, Any] = await launch_overhead(launches, cache_dir)
        for blocking in (True, False):
            mode = "blocking_sync" if blocking else "spin"
            for name, value in (await round_trip(blocking, 2000, cache_dir)).items():
                results[f"round_trip_{mode}_{name}"] = value
    results["launches"] = launches
    width = max(map(len, results))
    for name, value in results.items():
        print(f"{name:<{width}}  {value:8.2f}" if isinstance(value, float) else f"{name:<{width}}  {value}")
    if json_path:
        with open(json_path, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=10_000)
    parser.add_argument("--json")
    options = parser.parse_args()
    asyncio.run(main(options.launches, options.json))

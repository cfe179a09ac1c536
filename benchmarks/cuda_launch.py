"""The CUDA backend's own floor, in one process: raw cuLaunchKernel against the DeviceRuntime path.

    python3 -m benchmarks.cuda_launch [--launches 10000] [--json out.json]

Prints µs per launch for raw `cuLaunchKernel` (a pre-built void** array) and for
`DeviceRuntime.dispatch` of the same prepared 4-argument kernel (flush inside the timed window),
and the p50/p99 of one dispatch plus a 4-byte readback through the runtime, awaited in process:
everything gpud does for a request except the two socket legs.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import dataclasses
import json
import statistics
import struct
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpud.backends.cuda import open_device
from gpud.backends.cuda.driver import check, cu
from gpud.runtime.runtime import DeviceRuntime
from gpud_protocol import ArgKind, KernelOptions, Limits

SOURCE = """
extern "C" __global__ void scale(const float* x, float* y, float a, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i];
}
"""


@dataclasses.dataclass(frozen=True)
class Settings:
    cache_dir: Path
    max_dispatches_per_flush: int = 1024
    submission_target_s: float = 0.0
    pool_idle_release_s: float = 0.0
    flush_deadline_ms: float = 2.0
    max_submissions_in_flight: int = 16
    staging_pool_bytes: int = 64 << 20
    reuse_memory_bytes: int = 0
    kernel_cache_size: int = 16
    completion_spin_us: float = 50.0
    graph_cache_size: int = 0  # measure launches, not graph replays
    graph_min_launches: int = 16
    graph_pdl: bool = False
    bind_group_cache_size: int = 16
    limits: Limits = dataclasses.field(default_factory=Limits)


class _Owner:
    def work_lost(self, error: Any) -> None:
        raise error


def best_us(fn: Callable[[], None], launches: int, finish: Callable[[], None], repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(launches):
            fn()
        finish()
        best = min(best, time.perf_counter() - start)
    return best / launches * 1e6


async def measure(launches: int, samples: int, cache_dir: str) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    settings = Settings(Path(cache_dir))
    rt = DeviceRuntime(open_device(0, 0, loop, settings), settings, lambda _rt, error: None)
    got = rt.program(SOURCE, "scale", KernelOptions((256, 1, 1)))
    program = await got if isinstance(got, asyncio.Future) else got
    x, y = rt.alloc(4), rt.alloc(4)
    owner = _Owner()
    prepared = rt.prepare(program, (1, 1, 1), [x, y, (ArgKind.F32, 2.0), (ArgKind.U32, 1)])

    def runtime_dispatch() -> None:
        rt.dispatch(prepared, owner)

    results: dict[str, Any] = {}
    results["runtime_dispatch_us"] = best_us(runtime_dispatch, launches, rt.flush)
    await rt.synchronize()

    # raw cuLaunchKernel with the same arguments, on a stream of its own
    check(cu.cuCtxSetCurrent(rt.device._context))  # type: ignore[attr-defined]
    stream = check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING))
    function = program.native.function
    values = (ctypes.c_uint64 * 4)(x.native, y.native, 0, 0)
    struct.pack_into("<fI", values, 16, 2.0, 0)
    struct.pack_into("<I", values, 24, 1)
    pointers = (ctypes.c_void_p * 4)(*(ctypes.addressof(values) + 8 * i for i in range(4)))
    address = ctypes.addressof(pointers)

    def raw_launch() -> None:
        cu.cuLaunchKernel(function, 1, 1, 1, 256, 1, 1, 0, stream, address, 0)

    results["raw_cuLaunchKernel_us"] = best_us(raw_launch, launches, lambda: check(cu.cuStreamSynchronize(stream)))
    check(cu.cuStreamDestroy(stream))
    results["runtime_overhead_us"] = results["runtime_dispatch_us"] - results["raw_cuLaunchKernel_us"]

    # dispatch + 4-byte readback, awaited in process
    times = []
    for i in range(samples + 200):
        start = time.perf_counter()
        rt.dispatch(prepared, owner)
        done: asyncio.Future[None] = loop.create_future()
        rt.download(y, lambda part, data, error, done=done: done.set_result(None), owner)  # type: ignore[misc]
        rt.flush()
        await done
        if i >= 200:
            times.append(time.perf_counter() - start)
    results["round_trip_p50_us"] = statistics.median(times) * 1e6
    results["round_trip_p99_us"] = statistics.quantiles(times, n=100)[98] * 1e6
    rt.release(x)
    rt.release(y)
    await rt.close()
    return results


async def main(launches: int, json_path: str | None) -> None:
    with tempfile.TemporaryDirectory() as cache_dir:
        results = await measure(launches, 2000, cache_dir)
    results["launches"] = launches
    width = max(map(len, results))
    for name, value in results.items():
        print(f"{name:<{width}}  {value:8.2f}" if isinstance(value, float) else f"{name:<{width}}  {value}")
    if json_path:
        Path(json_path).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--launches", type=int, default=10_000)
    parser.add_argument("--json")
    options = parser.parse_args()
    asyncio.run(main(options.launches, options.json))

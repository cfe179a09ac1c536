"""The daemon's CPU to encode one dispatch of a replay on the webgpu backend (no client, no socket):

    python -m benchmarks.webgpu_encode [--dispatches 250] [--reps 40] [--json FILE]

A replay of `dispatches` elementwise dispatches is instantiated once and encoded `reps` times, each
followed by a flush and a sync outside the timing; printed: the least of the encodes, in µs per
dispatch, and the same for a dispatch encoded on its own (`encode_dispatch`). On a real GPU this CPU
is what a replay costs beyond the GPU's time (the cuda backend launches one CUDA graph instead).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import Any

from benchmarks import write_json
from gpud import ops
from gpud.backends import open_devices
from gpud.backends.base import Arg, DispatchStep
from gpud.runtime.runtime import DeviceRuntime
from gpud.service.config import Config
from gpud_protocol import ArgKind
from gpud_protocol.ops import KERNELS


class _Owner:
    def work_lost(self, _error: Any) -> None:
        return None


async def run(dispatches: int, reps: int) -> dict[str, float]:
    loop = asyncio.get_running_loop()
    config = Config()
    device = open_devices("webgpu", "all", loop, config)[0]
    rt = DeviceRuntime(device, config, lambda *_args: None)
    got = rt.program(ops.source("elementwise", "webgpu"), "ew_unary", ops.options(KERNELS["ew_unary"], "webgpu"))
    program = await got if isinstance(got, asyncio.Future) else got
    x, y = rt.alloc(4096), rt.alloc(4096)
    scalars: list[Arg] = [(ArgKind.U32, 1024), (ArgKind.U32, 0), (ArgKind.F32, 2.0), (ArgKind.F32, 0.0)]
    args: tuple[Arg, ...] = (
        x,
        y,
        *scalars,
        (ArgKind.U32, 0),
        (ArgKind.U32, 0),
    )  # ew_unary(x, out; n, op, a, b, x_dtype, out_dtype)
    plan = rt.instantiate([DispatchStep(program, (4, 1, 1), args) for _ in range(dispatches)])
    owner = _Owner()
    replay, single = [], []
    packed = device.prepare(program, (4, 1, 1), list(args))
    for _ in range(reps + 1):
        t0 = time.perf_counter()
        rt.replay(plan, [], owner)
        replay.append((time.perf_counter() - t0) / dispatches)
        rt.flush()
        await rt.synchronize()
        t0 = time.perf_counter()
        for _ in range(dispatches):
            device.encode_dispatch(packed)
        single.append((time.perf_counter() - t0) / dispatches)
        rt.flush()
        await rt.synchronize()
    await rt.close()
    return {"replay_us_per_dispatch": min(replay[1:]) * 1e6, "encode_dispatch_us": min(single[1:]) * 1e6}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.webgpu_encode", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dispatches", type=int, default=250, help="dispatches in the replay")
    parser.add_argument("--reps", type=int, default=40, help="encodes timed (the least is printed)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    results = asyncio.run(run(args.dispatches, args.reps))
    for name, value in results.items():
        print(f"  {name:<26} {value:6.2f}")
    write_json(args.json, {"benchmark": "webgpu_encode", "dispatches": args.dispatches, "reps": args.reps, **results})


if __name__ == "__main__":
    main()

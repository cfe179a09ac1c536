"""`gpud bench webgpu`: a chain of dependent dispatches then one readback, three ways.

1. in-process wgpu, one command buffer and submit per dispatch (what a naive runtime does);
2. in-process wgpu, every dispatch in one compute pass and one submit (the floor);
3. a client through gpud, which coalesces the same chain into one command buffer.

All three use the same `axpb` WGSL kernel on the same adapter, in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import struct
from functools import partial
from typing import Any

import numpy as np
import wgpu

import gpud_client
from benchmarks import per_item_us, print_table, time_async, time_sync, write_json
from gpud.testing import workloads as kernels
from gpud.testing.spawn import daemon

A, B = kernels.A, kernels.B


class InProcess:
    """Plain wgpu-py, written the way a user of wgpu would: pipeline and bind groups made once."""

    def __init__(self, n: int) -> None:
        adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
        self.adapter_info = dict(adapter.info)
        self.device = adapter.request_device_sync()
        module = self.device.create_shader_module(code=kernels.AXPB_WGSL)
        self.pipeline = self.device.create_compute_pipeline(
            layout="auto", compute={"module": module, "entry_point": "axpb"}
        )
        usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
        self.n = n
        self.bufs = [self.device.create_buffer(size=n * 4, usage=usage) for _ in range(2)]
        params = self.device.create_buffer_with_data(
            data=struct.pack("<ffI4x", A, B, n), usage=wgpu.BufferUsage.UNIFORM
        )
        layout = self.pipeline.get_bind_group_layout(0)
        self.bind_groups = [
            self.device.create_bind_group(
                layout=layout,
                entries=[
                    {"binding": 0, "resource": {"buffer": self.bufs[i]}},
                    {"binding": 1, "resource": {"buffer": self.bufs[1 - i]}},
                    {"binding": 2, "resource": {"buffer": params}},
                ],
            )
            for i in range(2)
        ]

    def run(self, x0: np.ndarray, chain: int, *, one_pass: bool) -> np.ndarray:
        queue = self.device.queue
        queue.write_buffer(self.bufs[0], 0, x0)
        groups = kernels.groups(self.n)
        if one_pass:
            encoder = self.device.create_command_encoder()
            compute = encoder.begin_compute_pass()
            compute.set_pipeline(self.pipeline)
            for i in range(chain):
                compute.set_bind_group(0, self.bind_groups[i % 2])
                compute.dispatch_workgroups(groups)
            compute.end()
            queue.submit([encoder.finish()])
        else:
            for i in range(chain):
                encoder = self.device.create_command_encoder()
                compute = encoder.begin_compute_pass()
                compute.set_pipeline(self.pipeline)
                compute.set_bind_group(0, self.bind_groups[i % 2])
                compute.dispatch_workgroups(groups)
                compute.end()
                queue.submit([encoder.finish()])
        data = queue.read_buffer(self.bufs[chain % 2])
        return np.frombuffer(data, np.float32)


async def _through_gpud(address: str, x0: np.ndarray, chain: int, reps: int) -> tuple[list[float], np.ndarray]:
    async with gpud_client.connect(address) as gpu:
        k = await gpu.kernel(kernels.AXPB_WGSL, "axpb")
        bufs = [gpu.empty(x0.size), gpu.empty(x0.size)]

        async def step() -> np.ndarray:
            return await kernels.run_chain(gpu, k, bufs, x0, chain)

        out = await step()
        samples = await time_async(step, reps)
        return samples, out


def main(args: argparse.Namespace) -> int:
    # lavapipe hands every dispatch to a thread pool by default, which costs ~50 us a dispatch on
    # a small host and hides what submission costs. Inline execution is also the better setting for
    # small dispatches; the in-process ways and the daemon (a child process) all run with it.
    os.environ.setdefault("LP_NUM_THREADS", "0")
    n, chain = 4096, 100
    reps = 5 if args.quick else 30
    x0 = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    ref = kernels.chain_reference(x0, chain)
    local = InProcess(n)
    results: dict[str, Any] = {
        "benchmark": "webgpu-chain",
        "n": n,
        "chain": chain,
        "reps": reps,
        "LP_NUM_THREADS": os.environ["LP_NUM_THREADS"],
    }
    results["adapter"] = {k: local.adapter_info.get(k) for k in ("device", "vendor", "adapter_type", "backend_type")}
    print(f"adapter: {results['adapter']['device']} ({results['adapter']['backend_type']})")
    print(f"workload: {chain} dependent axpb dispatches on {n} floats, then one readback; {reps} repetitions")

    timings: dict[str, dict[str, float]] = {}
    for name, one_pass in (("wgpu_submit_per_dispatch", False), ("wgpu_one_pass", True)):
        out = local.run(x0, chain, one_pass=one_pass)
        assert np.allclose(out, ref, rtol=1e-4, atol=1e-5), name
        timings[name] = per_item_us(time_sync(partial(local.run, x0, chain, one_pass=one_pass), reps), chain)

    with daemon("webgpu") as (address, _proc):
        samples, out = asyncio.run(_through_gpud(address, x0, chain, reps))
    assert np.allclose(out, ref, rtol=1e-4, atol=1e-5), "gpud"
    timings["gpud_client"] = per_item_us(samples, chain)

    per_dispatch = timings["wgpu_submit_per_dispatch"]["median"]
    rows = [
        (name, t["median"], f"{per_dispatch / t['median']:5.1f}x vs submit-per-dispatch") for name, t in timings.items()
    ]
    print_table("us per dispatch (median)", rows)
    results["us_per_dispatch"] = timings
    results["speedup_gpud_vs_submit_per_dispatch"] = per_dispatch / timings["gpud_client"]["median"]
    results["gpud_vs_one_pass"] = timings["gpud_client"]["median"] / timings["wgpu_one_pass"]["median"]
    write_json(args.json, results)
    return 0

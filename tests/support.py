"""Kernels and helpers shared by the integration tests, one source per backend.

Tests pick a kernel by `gpu.backend`, so every integration test runs unchanged on webgpu and cuda.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import numpy as np

import gpud_client
from gpud.testing import workloads as kernels
from gpud_client import u32


def benchmark(name: str) -> ModuleType:
    """A module of the checkout's benchmarks/ (not installed: `gpud bench` puts the checkout on the path too)."""
    root = str(Path(__file__).resolve().parents[1])
    if root not in sys.path:
        sys.path.insert(0, root)
    return importlib.import_module(f"benchmarks.{name}")


@dataclasses.dataclass
class Daemon:
    """A daemon started by a fixture: its address, its process and its backend."""

    address: str
    proc: subprocess.Popen[bytes]
    backend: str

    def assert_alive(self) -> None:
        assert self.proc.poll() is None, f"the daemon exited with {self.proc.returncode}"


ADD_WGSL = """
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> y: array<f32>;
@group(0) @binding(2) var<storage, read_write> z: array<f32>;
struct Params { n: u32 }
@group(0) @binding(3) var<uniform> p: Params;

@compute @workgroup_size(64)
fn add(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x < p.n) {
        z[gid.x] = x[gid.x] + y[gid.x];
    }
}
"""

ADD_CUDA = """
extern "C" __global__ void add(const float* x, const float* y, float* z, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) z[i] = x[i] + y[i];
}
"""

SCALE_WGSL = """
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
struct Params { a: f32 }
@group(0) @binding(2) var<uniform> p: Params;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x < arrayLength(&y)) {
        y[gid.x] = x[gid.x] * p.a;
    }
}
"""

SCALE_CUDA = """
extern "C" __global__ void main_kernel(const float* x, float* y, float a) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    y[i] = x[i] * a;
}
"""

BAD_SOURCE = {
    "webgpu": "@compute @workgroup_size(64)\nfn broken(@builtin(global_invocation_id) gid: vec3<u32>) {\n"
    "    let v: f32 = undefined_thing;\n}\n",
    "cuda": 'extern "C" __global__ void broken(float* x) { x[0] = undefined_thing; }\n',
}
BAD_ENTRY = "broken"
BAD_SYMBOL = "undefined_thing"  # every compiler names the unknown identifier in its log


async def axpb(gpu: gpud_client.Client, *, writes: list[int] | None = None) -> gpud_client.Kernel:
    """The built-in axpb: y = x * a + b. Args: x, y, a (f32), b (f32), n (u32)."""
    source, options = kernels.axpb_source(gpu.backend)
    if writes is None and gpu.backend == "cuda":
        writes = [1]  # CUDA C cannot be inspected for the tensors it writes
    return await gpu.kernel(source, "axpb", writes=writes, **options)  # type: ignore[arg-type]


async def add(gpu: gpud_client.Client) -> gpud_client.Kernel:
    """z = x + y. Args: x, y, z, n (u32)."""
    if gpu.backend == "cuda":
        return await gpu.kernel(ADD_CUDA, "add", block=(kernels.BLOCK, 1, 1), writes=[2])
    return await gpu.kernel(ADD_WGSL, "add")


async def scale(gpu: gpud_client.Client) -> gpud_client.Kernel:
    """The README's kernel: y = x * a for a whole number of 64-wide groups. Args: x, y, a (f32)."""
    if gpu.backend == "cuda":
        return await gpu.kernel(SCALE_CUDA, "main_kernel", block=(kernels.BLOCK, 1, 1), writes=[1])
    return await gpu.kernel(SCALE_WGSL, entry="main")


def last_seq(gpu: gpud_client.Client) -> int:
    """The sequence number of the op queued last (to check which op an error names)."""
    seq: int = gpu._last_seq
    return seq


def run_axpb(
    gpu: gpud_client.Client, k: gpud_client.Kernel, x: gpud_client.Tensor, y: gpud_client.Tensor, a: float, b: float
) -> None:
    n = x.shape[0]
    gpu.dispatch(k, kernels.groups(n), [x, y, float(a), float(b), u32(n)])


def run_add(
    gpu: gpud_client.Client,
    k: gpud_client.Kernel,
    x: gpud_client.Tensor,
    y: gpud_client.Tensor,
    z: gpud_client.Tensor,
) -> None:
    n = x.shape[0]
    gpu.dispatch(k, kernels.groups(n), [x, y, z, u32(n)])


def ref_axpb(x: np.ndarray, a: float, b: float) -> np.ndarray:
    return (x.astype(np.float32) * np.float32(a) + np.float32(b)).astype(np.float32)


def assert_close(out: np.ndarray, ref: np.ndarray, rtol: float = 1e-4) -> None:
    """float32 results: GPUs may fuse multiply-add, so allow a little relative to the scale."""
    assert out.shape == ref.shape and out.dtype == ref.dtype
    scale = max(1.0, float(np.max(np.abs(ref)))) if ref.size else 1.0
    np.testing.assert_allclose(out, ref, rtol=rtol, atol=rtol * scale)


async def device_memory(address: str) -> dict[str, Any]:
    """The daemon's device counters summed over its devices, from a fresh session that allocates nothing."""
    async with gpud_client.connect(address) as gpu:
        stats = await gpu.stats()
    total: dict[str, Any] = {}
    for device in stats["devices"]:
        for key, value in device.items():
            if type(value) in (int, float) and key != "index":
                total[key] = total.get(key, 0) + value
    return total


async def wait_for_memory(address: str, baseline: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
    """Poll until memory_in_use and live_buffers are back to `baseline` (release follows completion)."""
    deadline = time.monotonic() + timeout
    while True:
        now = await device_memory(address)
        if (now["memory_in_use"], now["live_buffers"]) == (baseline["memory_in_use"], baseline["live_buffers"]):
            return now
        if time.monotonic() > deadline:
            raise AssertionError(f"device memory did not return to its baseline: {now} vs {baseline}")
        await anyio.sleep(0.05)


async def check_well_behaved(gpu: gpud_client.Client, k: gpud_client.Kernel | None = None, seed: int = 0) -> None:
    """A small axpb round trip that must give the right answer (pass `k` when calling it often)."""
    k = k or await axpb(gpu)
    x = np.random.default_rng(seed).standard_normal(513).astype(np.float32)
    tx, ty = gpu.tensor(x), gpu.empty(513)
    run_axpb(gpu, k, tx, ty, 1.5, -2.0)
    assert_close(await ty.numpy(), ref_axpb(x, 1.5, -2.0))
    tx.free()
    ty.free()


SPIN_WGSL = """
@group(0) @binding(0) var<storage, read_write> y: array<f32>;
struct Params { iters: u32 }
@group(0) @binding(1) var<uniform> p: Params;

@compute @workgroup_size(64)
fn spin(@builtin(global_invocation_id) gid: vec3<u32>) {
    var acc = f32(gid.x);
    for (var i = 0u; i < p.iters; i = i + 1u) {  // below lavapipe's 65,535-iteration loop limit
        acc = acc * 0.999 + 1.0;
    }
    if (gid.x < arrayLength(&y)) {
        y[gid.x] = acc;
    }
}
"""

SPIN_CUDA = """
extern "C" __global__ void spin(float* y, unsigned int iters) {
    long long start = clock64();
    while (clock64() - start < (long long)iters * 1000) {}
    y[threadIdx.x] = 1.0f;
}
"""


async def spin(gpu: gpud_client.Client) -> gpud_client.Kernel:
    """A kernel that keeps the device busy: spin(y, iters). Args: y (64+ floats), iters (u32)."""
    if gpu.backend == "cuda":
        return await gpu.kernel(SPIN_CUDA, "spin", block=(64, 1, 1))
    if gpu.backend == "fake":
        return await gpu.kernel("fake:spin", "spin")
    return await gpu.kernel(SPIN_WGSL, "spin")


async def occupy(gpu: gpud_client.Client, seconds: float) -> gpud_client.Tensor:
    """Queue about `seconds` of device work (calibrated on one dispatch) and send it, without waiting."""
    k = await spin(gpu)
    y = gpu.empty(64 * 64)
    if gpu.backend == "fake":
        gpu.dispatch(k, 1, [y, u32(int(seconds * 1000))])
        await gpu.flush()
        return y
    iters = 60_000 if gpu.backend == "webgpu" else 1_000  # cuda: ~1 ms a dispatch at ~1 GHz
    t0 = time.perf_counter()
    gpu.dispatch(k, 64, [y, u32(iters)])
    await gpu.sync()
    one = max(time.perf_counter() - t0, 1e-4)
    for _ in range(max(1, int(seconds / one))):
        gpu.dispatch(k, 64, [y, u32(iters)])
    await gpu.flush()
    return y


TRIES = 5  # rounds a test sent "together" gets before a split slice fails it (`stopped`)


@contextlib.contextmanager
def stopped(daemon: Daemon) -> Iterator[None]:
    """The daemon stopped (SIGSTOP) meanwhile: what clients send then waits in its socket, and once
    continued it usually reads it in one slice. Not always: ZeroMQ's I/O thread may hand the loop one
    peer's message before it has read the next peer's, and the slice splits. So a test that counts on
    one slice checks its counters and sends again, `TRIES` rounds at most (`until_together`)."""
    os.kill(daemon.proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(daemon.proc.pid, signal.SIGCONT)


async def until_together(round_: Callable[[], Awaitable[bool]], what: str) -> None:
    """Run `round_` (which sends while `stopped` and checks every result) until it says the daemon
    read its messages in one slice, `TRIES` rounds at most."""
    for _ in range(TRIES):
        if await round_():
            return
    raise AssertionError(f"{what}: not once in {TRIES} rounds")

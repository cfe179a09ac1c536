"""Built-in kernels used by the demo, the benchmarks and the tests, one source per backend.

`axpb`: y[i] = x[i] * a + b for i < n. Arguments: x, y, a (f32), b (f32), n (u32).
"""

from __future__ import annotations

import numpy as np

import gpud_client

AXPB_WGSL = """
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
struct Params { a: f32, b: f32, n: u32 }
@group(0) @binding(2) var<uniform> p: Params;

@compute @workgroup_size(64)
fn axpb(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x < p.n) {
        y[gid.x] = x[gid.x] * p.a + p.b;
    }
}
"""

AXPB_CUDA = """
extern "C" __global__ void axpb(const float* x, float* y, float a, float b, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] * a + b;
}
"""

BLOCK = 64  # threads per workgroup/block for every built-in kernel


def axpb_source(backend: str) -> tuple[str, dict[str, object]]:
    """(source, kernel options) for the client's `kernel()` call on `backend`."""
    if backend == "cuda":
        return AXPB_CUDA, {"block": (BLOCK, 1, 1)}
    if backend == "fake":
        return "fake:axpb", {}
    return AXPB_WGSL, {}


def groups(n: int) -> int:
    return (n + BLOCK - 1) // BLOCK


# The chain workload of the demo and the benchmarks: x <- x * A + B, each dispatch reading the
# previous one's output, ping-ponging between two tensors.
A, B = 0.999, 0.001


def chain_reference(x0: np.ndarray, chain: int) -> np.ndarray:
    """What `run_chain` computes, in float32 numpy."""
    x = x0
    for _ in range(chain):
        x = (x * np.float32(A) + np.float32(B)).astype(np.float32)
    return x


async def run_chain(
    gpu: gpud_client.Client,
    k: gpud_client.Kernel,
    bufs: list[gpud_client.Tensor],
    x0: np.ndarray,
    chain: int,
    *,
    each: bool = False,
) -> np.ndarray:
    """One step: `x0` into bufs[0], `chain` axpb dispatches, then read the result back.

    `each`: wait for every dispatch (one submit and round trip each), to compare with coalescing.
    """
    n = x0.size
    bufs[0].upload(x0)
    n32, grid = gpud_client.u32(n), groups(n)
    for i in range(chain):
        gpu.dispatch(k, grid, [bufs[i % 2], bufs[(i + 1) % 2], A, B, n32])
        if each:
            await gpu.sync()
    return await bufs[chain % 2].numpy()


# `axpw`: y[i] = x[i] * a + w[i] for i < n, where w is typically a shared read-only resident tensor.
# Arguments: x, w, y, a (f32), n (u32).
AXPW_WGSL = """
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
struct Params { a: f32, n: u32 }
@group(0) @binding(3) var<uniform> p: Params;

@compute @workgroup_size(64)
fn axpw(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x < p.n) {
        y[gid.x] = x[gid.x] * p.a + w[gid.x];
    }
}
"""

AXPW_CUDA = """
extern "C" __global__ void axpw(const float* x, const float* w, float* y, float a, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] * a + w[i];
}
"""


def axpw_source(backend: str) -> tuple[str, dict[str, object]]:
    if backend == "cuda":
        return AXPW_CUDA, {"block": (BLOCK, 1, 1)}
    if backend == "fake":
        return "fake:axpw", {}
    return AXPW_WGSL, {}

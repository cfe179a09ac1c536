"""prefetch (a hint, CUDA only: gpud_protocol.ops.prefetch): it changes no value, eagerly or recorded
into a replay graph between the ops it serves, for any number of tensors (four a launch); it refuses what
is not a tensor, naming the op; the daemon's rule bounds the bytes by each tensor's; on backends
without the kernel the op does nothing and a raw dispatch is refused by name."""

from __future__ import annotations

import numpy as np
import pytest

import gpud_client
from gpud_protocol.ops import KERNELS, OpError, TensorInfo
from gpud_protocol.ops.prefetch import PREFETCH_MAX, SLICE, prefetch_grid


async def test_prefetch_changes_no_value_eagerly_or_in_a_graph(gpu: gpud_client.Client) -> None:
    rng = np.random.default_rng(3)
    x0 = rng.standard_normal((1, 96)).astype(np.float32)
    weights = [gpu.tensor(rng.standard_normal((40 + i, 96)).astype(np.float16)) for i in range(5)]
    x = gpu.tensor(x0)
    alone = [await gpu.ops.matmul(x, w, transpose_w=True).numpy() for w in weights]
    gpu.ops.prefetch(*weights, x)  # two launches on CUDA: four tensors, then two
    after = [await gpu.ops.matmul(x, w, transpose_w=True).numpy() for w in weights]
    for a, b in zip(alone, after, strict=True):
        np.testing.assert_array_equal(a, b)
    g = gpu.graph("prefetch")
    xi = g.input("x", (1, 96), "float32")
    first = gpu.ops.matmul(xi, weights[0], transpose_w=True, graph=g)
    gpu.ops.prefetch(*weights[1:], graph=g)
    for i, w in enumerate(weights[1:], 1):
        g.output(f"y{i}", gpu.ops.matmul(xi, w, transpose_w=True, graph=g))
    g.output("y0", first)
    step = await g.build()
    got = await step.replay(x=x0)
    for i in range(5):
        np.testing.assert_array_equal(got[f"y{i}"], alone[i])
    step.free()


async def test_prefetch_takes_tensors_only(gpu: gpud_client.Client) -> None:
    with pytest.raises(gpud_client.InvalidArgument, match="prefetch takes tensors") as caught:
        gpu.ops.prefetch(gpu.tensor(np.ones(4, np.float32)), np.ones(4))
    assert caught.value.op == "prefetch"
    gpu.ops.prefetch()  # nothing to fetch: nothing queued


def test_the_rule_bounds_the_bytes_by_each_tensor() -> None:
    spec = KERNELS["prefetch_l2"]
    a, b = TensorInfo("float16", (10, 8)), TensorInfo("int32", (3,))
    spec.verify([a, b, a, a], [160, 12, 0, 1])
    with pytest.raises(OpError, match="b: 13 bytes asked of a tensor of 12"):
        spec.verify([a, b, a, a], [160, 13, 0, 0])
    assert prefetch_grid([0, 0, 0, 0]) == (1, 4, 1)
    assert prefetch_grid([1, SLICE, SLICE + 1, 5]) == (2, 4, 1)


async def test_a_raw_dispatch_runs_on_cuda_and_is_refused_by_name_elsewhere(gpu: gpud_client.Client) -> None:
    big = gpu.empty((PREFETCH_MAX // 4 + 4099,), "float32")  # the op's cap passed, slices not whole
    small = gpu.tensor(np.arange(5, dtype=np.float32))
    sizes = [big.nbytes, 20, 3, 0]
    gpu.ops._run("prefetch_l2", prefetch_grid(sizes), [big, small, small, small], sizes, None)
    if gpu.backend == "cuda":
        np.testing.assert_array_equal(await small.numpy(), np.arange(5, dtype=np.float32))
    else:
        with pytest.raises(gpud_client.GpudError, match="prefetch"):
            await small.numpy()
    big.free()

"""Products by a read-only weight recorded into a replay graph, on every backend: on CUDA they run on
matvec_ro and matvec_norm_ro (gpud_protocol.ops.matvec_ro), which start reading the weight while the
kernel before them finishes, and give the bits of the eager ops (matvec, matvec_norm); elsewhere the same
kernels as eager. Decode's shapes (one and two rows, K past one thread's loads, N past one wave), a
replay after a step that rewrites their input, so an early read of anything but the weight would show."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

import gpud_client
from gpud_protocol.ops.matmul import SHORT
from ops.test_fused import stored

EPS = 1e-6


@pytest.mark.parametrize(("rows", "k", "n", "wd"), [(1, 896, 1152, "float16"), (2, 4864, 896, "bfloat16")])
async def test_products_of_a_read_only_weight_in_a_graph_equal_the_eager_ones(
    gpu: gpud_client.Client, rows: int, k: int, n: int, wd: str
) -> None:
    rng = np.random.default_rng(5)
    name = f"ro-{uuid.uuid4().hex[:8]}"
    mine = gpu.tensor(stored(rng.standard_normal((n, k)) / np.sqrt(k), wd), dtype=wd)
    gpu.publish(mine, name, mode="ro")
    w = await gpu.open(name)
    nw = gpu.tensor(stored(rng.standard_normal(k) * 0.5 + 1.0, "float32"))
    g = gpu.graph(f"{name}-step")
    gx, gr = g.input("x", (rows, k), "float32"), g.input("r", (rows, k), "float32")
    doubled = gpu.ops.scale(gx, 2.0, graph=g)  # the kernel before the product writes its x
    g.output("y", gpu.ops.matmul(gpu.ops.scale(doubled, 0.5, graph=g), w, transpose_w=True, graph=g))
    g.output("z", gpu.ops.rmsnorm_matmul(gx, nw, w, EPS, residual=gr, transpose_w=True, graph=g))
    step = await g.build()
    for _ in range(3):  # new inputs each time: a product that read its x early would show the last one's
        x0, r0 = (rng.standard_normal((rows, k)).astype(np.float32) for _ in range(2))
        x, r = gpu.tensor(x0), gpu.tensor(r0)
        y = gpu.ops.matmul(x, w, transpose_w=True)
        z = gpu.ops.rmsnorm_matmul(x, nw, w, EPS, residual=r, transpose_w=True)
        got = await step.replay(x=x0, r=r0)
        np.testing.assert_array_equal(got["y"], await y.numpy())
        np.testing.assert_array_equal(got["z"], await z.numpy())
        for t in (x, r, y, z):
            t.free()
    if gpu.backend == "cuda":
        assert {f"matvec_ro_f32_{SHORT[wd]}", f"matvec_norm_ro_f32_{SHORT[wd]}_f32"} <= set(gpu.ops._kernels)
    step.free()
    for t in (nw, w):
        t.free()
    gpu.unpublish(name)
    mine.free()

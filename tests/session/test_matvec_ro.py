"""matvec_ro and matvec_norm_ro (gpud_protocol.ops.matvec_ro) read their weight before the kernel before
them has finished, so the daemon takes them in a replay graph only, with a weight the recording session
holds read-only and that no step of the graph writes; the op library records them on CUDA for a
read-only weight. In process (benchmarks/daemon_inproc.py: a fake device of kind "cuda" whose kernels do
nothing), so what is checked is the choice and the refusals, not the numbers."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
from support import benchmark

import gpud_client
from gpud_client import InvalidArgument, u32
from gpud_protocol.ops import KERNELS
from gpud_protocol.ops.matmul import SPECS as MATMUL_SPECS
from gpud_protocol.ops.matmul import matvec_grid
from gpud_protocol.ops.matvec_norm import SPECS as NORM_SPECS
from gpud_protocol.ops.matvec_ro import EARLY

N, K = 48, 64
EARLY_READ = "before the kernel before it has finished"


async def session() -> tuple[gpud_client.Client, Any, Any]:
    """A session of the in-process daemon, a float16 weight of its own (`w`, read-write) and the same weight
    published read-only and opened (`wr`)."""
    inproc = benchmark("daemon_inproc")
    daemon = inproc.InProcessDaemon(asyncio.get_running_loop(), inproc.Clock())
    gpu = gpud_client.Client(inproc.Loopback(daemon))
    w = gpu.tensor(np.ones((N, K), np.float16))
    gpu.publish(w, "ro.w", mode="ro")
    return gpu, w, await gpu.open("ro.w")


def raw_matvec(g: Any, gpu: gpud_client.Client, name: str, x: Any, w: Any, out: Any) -> None:
    scalars = [u32(v) for v in (1, 1, N, K, 0, 0, 1, 0)]
    g.dispatch(gpu.ops._kernel(name), matvec_grid(1, N, K, True), [x, w, x, out, *scalars])


def test_the_early_kernels_are_matvec_and_matvec_norm_with_their_weight_read_early() -> None:
    plain = {spec.name: spec for spec in [*MATMUL_SPECS, *NORM_SPECS]}
    assert set(EARLY) == {f"matvec_f32_{w}" for w in ("f32", "f16", "bf16")} | {s.name for s in NORM_SPECS}
    for name, early in EARLY.items():
        spec, ro = plain[name], KERNELS[early]
        assert (ro.tensors, ro.writes, ro.scalars, ro.block, ro.op, ro.family) == (
            spec.tensors,
            spec.writes,
            spec.scalars,
            spec.block,
            spec.op,
            spec.family,
        )
        assert [spec.tensors[p] for p in ro.early] == ["w"] and spec.early == ()


@pytest.mark.parametrize("read_only", [True, False])
async def test_a_graph_records_the_early_kernels_for_a_read_only_weight(read_only: bool) -> None:
    gpu, w, wr = await session()
    weight = wr if read_only else w
    g = gpu.graph("products")
    x = g.input("x", (1, K), "float32")
    res, norm = g.input("res", (1, K), "float32"), gpu.tensor(np.ones(K, np.float32))
    g.output("y", gpu.ops.matmul(x, weight, transpose_w=True, graph=g))
    g.output("z", gpu.ops.rmsnorm_matmul(x, norm, weight, 1e-6, residual=res, transpose_w=True, graph=g))
    step = await g.build()
    await step.replay(x=np.ones((1, K), np.float32), res=np.ones((1, K), np.float32))
    used = set(gpu.ops._kernels)
    early = {"matvec_ro_f32_f16", "matvec_norm_ro_f32_f16_f32"}
    assert early <= used if read_only else not early & used
    gpu.ops.matmul(gpu.tensor(np.ones((1, K), np.float32)), weight, transpose_w=True)  # eager: matvec
    await gpu.sync()
    assert "matvec_f32_f16" in gpu.ops._kernels


async def test_an_early_kernel_outside_a_graph_is_refused() -> None:
    gpu, _w, wr = await session()
    x, out = gpu.tensor(np.ones((1, K), np.float32)), gpu.empty((1, N), "float32")
    scalars = [u32(v) for v in (1, 1, N, K, 0, 0, 1, 0)]
    gpu.dispatch(gpu.ops._kernel("matvec_ro_f32_f16"), matvec_grid(1, N, K, True), [x, wr, x, out, *scalars])
    with pytest.raises(InvalidArgument, match=f"{EARLY_READ}.*outside a replay graph"):
        await gpu.sync()


@pytest.mark.parametrize("case", ["a weight it may write", "a bound tensor", "written before", "written after"])
async def test_a_graph_whose_early_read_is_not_a_read_only_weight_is_refused(case: str) -> None:
    """The early read of a weight the session may write, of a bound tensor, or of a read-only weight whose
    memory another step writes (through the session's own handle of it) before or after: refused."""
    gpu, w, wr = await session()
    x = gpu.tensor(np.ones((1, K), np.float32))
    g = gpu.graph("refused")
    out = g.empty((1, N), "float32")
    if case == "written before":
        g.copy(gpu.tensor(np.zeros((N, K), np.float16)), w)
    weight = {"a weight it may write": w, "a bound tensor": g.bind("w", (N, K), "float16")}.get(case, wr)
    raw_matvec(g, gpu, "matvec_ro_f32_f16", x, weight, out)
    if case == "written after":
        g.upload(w, np.zeros((N, K), np.float16))
    g.output("out", out)
    with pytest.raises(InvalidArgument, match=EARLY_READ):
        await g.build()


async def test_a_graph_whose_early_read_is_a_read_only_weight_is_built_and_replayed() -> None:
    gpu, _w, wr = await session()
    g = gpu.graph("accepted")
    out = g.empty((1, N), "float32")
    raw_matvec(g, gpu, "matvec_ro_f32_f16", gpu.tensor(np.ones((1, K), np.float32)), wr, out)
    g.output("out", out)
    assert (await (await g.build()).replay())["out"].shape == (1, N)

"""A kernel whose registration failed: what a dispatch or a graph naming its handle is told. The op
library registers its kernels without awaiting them, so its user sees the dispatch's error first,
and that error must say why (gpud.session.kernels.KernelTable.failed)."""

from __future__ import annotations

import numpy as np
import pytest

import gpud_client
from gpud.backends.base import Program
from gpud.session.kernels import FAILURES_KEPT, KernelTable
from gpud.testing import spawn
from gpud_protocol import KernelOptions
from gpud_protocol.errors import NotFound

REASON = "the op library has no fake sources"


def test_a_failed_handle_says_why_until_it_names_a_kernel() -> None:
    table = KernelTable(8)
    assert table.unknown(3) == "unknown kernel handle 3"
    table.failed(3, "embedding_f32_f32", "no sources")
    assert table.unknown(3) == "kernel embedding_f32_f32 (handle 3) could not be registered: no sources"
    program = Program(("k",), "axpb", None, None, None, None)
    table.add(3, ("src", "axpb", KernelOptions()), "src", "axpb", KernelOptions(), 0, program)
    assert table.unknown(3) == "unknown kernel handle 3"  # registered since: the old reason is gone
    table.failed(4, "x", "why")
    table.clear()
    assert table.unknown(4) == "unknown kernel handle 4"


def test_failures_are_bounded_and_forgotten_oldest_first() -> None:
    table = KernelTable(8)
    for handle in range(FAILURES_KEPT + 1):
        table.failed(handle, "k", "why")
    assert table.unknown(0) == "unknown kernel handle 0"
    assert table.unknown(FAILURES_KEPT) == f"kernel k (handle {FAILURES_KEPT}) could not be registered: why"


async def test_an_op_whose_kernel_failed_names_the_kernel_and_why() -> None:
    # The fake backend has no op-library sources: every library kernel fails to register there.
    with spawn.daemon("fake", extra_args=("--devices", "0")) as (address, _proc):
        async with gpud_client.connect(address) as gpu:
            table = gpu.tensor(np.ones((10, 8), np.float32))
            ids = gpu.tensor(np.array([1, 2], np.int32))
            with pytest.raises(NotFound, match=f"embedding.*kernel embedding_f32_f32 .*registered: {REASON}"):
                await gpu.ops.embedding(ids, table).numpy()
            with pytest.raises(gpud_client.GpudError, match=REASON):  # the registration's own error
                await gpu.sync()

            g = gpu.graph("step")
            x = g.input("ids", 2, "int32")
            g.output("out", gpu.ops.embedding(x, table, graph=g))
            with pytest.raises(gpud_client.GpudError, match=f"embedding_f32_f32 .*registered: {REASON}"):
                await g.build()

"""Registering the op library's kernels: a session registers in order, but while it waits for one
compile it starts the batch's (and its waiting batches') other built-in kernels on the device's compile
threads, so a forward's families compile side by side instead of one after another."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from runtime.test_runtime import Settings

import gpud_protocol as proto
from gpud.backends.base import Program
from gpud.backends.fake import FakeDevice, FakeKernel
from gpud.runtime.runtime import DeviceRuntime
from gpud_protocol import KernelOptions
from gpud_protocol.ops import KERNELS
from session.test_graph_build import Daemon, _session


class TwoAtOnce(FakeDevice):
    """Compiles the op library's kernels into no-ops, each only once another compile runs beside it."""

    kind = "cuda"
    compile_threads = 2

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(0, loop, 64 << 20)
        self.together = threading.Barrier(2, timeout=10)

    def compile(self, key: tuple[Any, ...], source: str, entry: str, options: KernelOptions) -> Program:
        self.together.wait()  # raises (a failed compile) if nothing else compiles meanwhile
        spec = KERNELS[entry]
        kernel = FakeKernel(lambda *_args: None, len(spec.tensors), tuple(k for _n, k in spec.scalars), frozenset())
        return Program(key, entry, kernel, kernel.tensors, kernel.scalars, kernel.writes)


async def test_a_batch_of_registrations_compiles_side_by_side() -> None:
    rt = DeviceRuntime(TwoAtOnce(asyncio.get_running_loop()), Settings(), lambda _rt, error: None)
    session, daemon, replies = _session(rt)
    assert isinstance(daemon, Daemon)
    ops: list[Any] = [
        proto.RegisterKernel(1, 1, "gpud:ew_binary", "ew_binary", KernelOptions()),  # elementwise.cu
        proto.RegisterKernel(2, 2, "gpud:matvec_f32_f32", "matvec_f32_f32", KernelOptions()),  # matmul.cu
    ]
    try:
        session.receive(proto.Batch(ops, (), [], 0, False))
        while daemon.tasks:
            await daemon.tasks.pop(0)
        assert [r.get("handle") for r in replies] == [1, 2], replies
    finally:
        await rt.close()


async def test_a_waiting_batch_s_registrations_start_too() -> None:
    """The first batch waits for its compile; the next, held back behind it, starts its own meanwhile."""
    rt = DeviceRuntime(TwoAtOnce(asyncio.get_running_loop()), Settings(), lambda _rt, error: None)
    session, daemon, replies = _session(rt)
    try:
        session.receive(
            proto.Batch([proto.RegisterKernel(1, 1, "gpud:ew_cast", "ew_cast", KernelOptions())], (), [], 0, False)
        )
        session.receive(
            proto.Batch(
                [proto.RegisterKernel(2, 2, "gpud:matmul_f32_f32", "matmul_f32_f32", KernelOptions())], (), [], 1, False
            )
        )
        while daemon.tasks:
            await daemon.tasks.pop(0)
        assert [r.get("handle") for r in replies] == [1, 2], replies
    finally:
        await rt.close()

"""A graph build's ways out, in process on the fake backend: whatever way it ends, it keeps nothing.

Issue 14 §2.2: a build that failed after a recorded upload kept that upload's buffer, charged to
nobody. These are the paths a daemon test cannot time: the session ending while the build waits
for staging, and an allocation failing after the recorded uploads were made.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Coroutine
from typing import Any

import numpy as np
from runtime.test_runtime import Settings as RuntimeSettings
from runtime.test_runtime import make

import gpud_protocol as proto
from gpud.runtime.runtime import DeviceRuntime
from gpud.session.graphs import GraphStore
from gpud.session.merging import Merger
from gpud.session.residents import ResidentStore
from gpud.session.session import Session
from gpud_protocol import ArgKind


@dataclasses.dataclass(frozen=True)
class Settings:
    limits: proto.Limits = proto.DEFAULT_LIMITS
    session_memory_bytes: int = 1 << 30
    session_max_requests: int = 64
    session_max_handles: int = 1024
    session_max_kernels: int = 64
    session_max_failures: int = 64
    session_window: int = 64
    session_reply_bytes: int = 64 << 20
    session_max_graphs: int = 8
    graph_instances: int = 8
    merge_replays: bool = True
    merge_wait_us: float = 2000.0
    trace: bool = False


class Daemon:
    def __init__(self, rt: DeviceRuntime) -> None:
        self.runtimes = [rt]
        self.residents = ResidentStore(lambda tensor: rt.release(tensor.buffer))
        self.graph_store = GraphStore(lambda _session: False)
        self.merger = Merger()
        self.tasks: list[asyncio.Task[None]] = []

    def spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        self.tasks.append(asyncio.ensure_future(coroutine))

    def after_work(self) -> None:
        for rt in self.runtimes:
            rt.after_drain()


def _session(rt: DeviceRuntime) -> tuple[Session, Daemon, list[dict[str, Any]]]:
    replies: list[dict[str, Any]] = []
    daemon = Daemon(rt)

    def send(frames: list[Any]) -> None:
        replies.append(proto.decode_server_message(frames, proto.DEFAULT_LIMITS)[0])

    return Session("s1", "test", send, daemon, Settings(), 0), daemon, replies


def _build(data: bytes, temp_bytes: int) -> proto.Batch:
    """temp 0 (`data`'s size) gets `data` recorded; temp 1 (`temp_bytes`) is output."""
    graph = proto.GraphDef(
        inputs=(),
        scalars=(),
        binds=(),
        temps=(("uint8", (len(data),)), ("uint8", (temp_bytes,))),
        steps=(proto.GraphUpload(0, (int(ArgKind.TEMP), 0)),),
        outputs=(proto.GraphOutput("t", (int(ArgKind.TEMP), 1)),),
        views=(),
    )
    return proto.Batch([proto.BuildGraph(1, 100, "g", graph)], (), [data], 0, False)


async def _settled(rt: DeviceRuntime, daemon: Daemon) -> None:
    await asyncio.gather(*daemon.tasks)
    await rt.synchronize()
    for _ in range(3):
        await asyncio.sleep(0)  # the releases run as completions


async def test_a_session_ending_while_its_build_waits_for_staging_keeps_nothing() -> None:
    rt, _ = make(RuntimeSettings(staging_pool_bytes=1 << 20, flush_deadline_ms=10_000))  # 512 KiB for uploads
    session, daemon, replies = _session(rt)
    session.receive(_build(np.ones(1 << 20, np.uint8).tobytes(), 256))
    assert daemon.tasks, "the build waits for staging"
    assert session.private_bytes[0] >= 1 << 20  # the recording's buffer is charged while it lives
    session.close()
    await _settled(rt, daemon)
    assert (rt.memory_in_use, rt.live_buffers) == (0, 0)
    assert not session.graphs and not replies
    await rt.close()


async def test_a_build_that_waited_for_staging_completes() -> None:
    rt, _ = make(RuntimeSettings(staging_pool_bytes=1 << 20, flush_deadline_ms=10_000))
    session, daemon, replies = _session(rt)
    session.receive(_build(np.ones(1 << 20, np.uint8).tobytes(), 256))
    await _settled(rt, daemon)
    assert replies and replies[0].get("handle") == 100, replies
    family = session.graphs[100]
    assert session.private_bytes[0] == family.charged == family.nbytes >= (1 << 20) + 256
    session.close()
    await _settled(rt, daemon)
    assert (rt.memory_in_use, rt.live_buffers) == (0, 0)
    await rt.close()


async def test_an_allocation_failing_after_the_recorded_uploads_keeps_nothing() -> None:
    rt, _ = make(memory=1 << 20)  # the device has 1 MiB; the quota is larger
    session, daemon, replies = _session(rt)
    session.receive(_build(np.ones(4096, np.uint8).tobytes(), 2 << 20))  # the output slot does not fit
    await _settled(rt, daemon)
    assert replies and replies[0]["err"][0] == proto.ErrorCode.OUT_OF_MEMORY, replies
    assert not session.graphs and session.private_bytes[0] == 0
    assert (rt.memory_in_use, rt.live_buffers) == (0, 0)
    session.close()
    await rt.close()

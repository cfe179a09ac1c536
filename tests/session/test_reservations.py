"""A replay or readback whose encoding fails after its reply was counted (its scratch refused, its plan
failed, its download refused) gives the count back: the session's requests in flight and reply bytes
return to zero, and its next requests run. In process (benchmarks/daemon_inproc.py), the failures
injected."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest
from support import benchmark

import gpud_client
from gpud.session import graph_ops
from gpud_client import InvalidArgument, OutOfMemory, u32


def refusing(error: Exception) -> Any:
    def encode(*_args: Any) -> None:
        raise error

    return encode


async def test_a_failed_encoding_gives_back_its_reply_reservation(monkeypatch: pytest.MonkeyPatch) -> None:
    inproc = benchmark("daemon_inproc")
    daemon = inproc.InProcessDaemon(asyncio.get_running_loop(), inproc.Clock())
    gpu = gpud_client.Client(inproc.Loopback(daemon))
    k = await gpu.kernel("fake:axpb", "axpb")
    g = gpu.graph("reserved")
    x = g.input("x", (64,), "float32")
    y = g.empty((64,), "float32")
    g.dispatch(k, 1, [x, y, 0.5, 1.0, u32(64)])
    g.output("y", y)
    g.feed("y", into="x")
    step = await g.build()
    session, x0 = daemon.session, np.zeros(64, np.float32)

    def steps() -> Awaitable[dict[str, Any]]:
        return step.replay_steps(3, x=x0)

    def one() -> Awaitable[dict[str, Any]]:
        return step.replay(x=x0)

    cases: list[tuple[str, Exception, Callable[[], Awaitable[dict[str, Any]]]]] = [
        ("execute_steps", OutOfMemory("injected: no scratch"), steps),
        ("execute", InvalidArgument("injected: no plan"), one),
    ]
    for name, error, call in cases:
        with monkeypatch.context() as patched:
            patched.setattr(graph_ops, name, refusing(error))
            with pytest.raises(type(error), match="injected"):
                await call()
        assert (session.requests_in_flight, session.reply_bytes_reserved) == (0, 0)
        assert (await call())["y"].shape[-1] == 64  # the next request runs
    assert (session.requests_in_flight, session.reply_bytes_reserved) == (0, 0)
    t = gpu.tensor(np.arange(64, dtype=np.float32))
    with monkeypatch.context() as patched:  # a readback whose download is refused
        patched.setattr(daemon.runtimes[0], "download", refusing(OutOfMemory("injected: no staging")))
        with pytest.raises(OutOfMemory, match="injected"):
            await t.numpy()
    assert (session.requests_in_flight, session.reply_bytes_reserved) == (0, 0)
    np.testing.assert_array_equal(await t.numpy(), np.arange(64, dtype=np.float32))

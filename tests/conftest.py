"""Fixtures: a real daemon per backend (webgpu always, cuda where a CUDA device exists).

The `daemon` fixture is session-scoped and parametrized over backends, so every integration test
runs once per available backend. `gpu` is a connected client. A client's connection runs an anyio
task group, which must be entered and left by one task, while pytest-asyncio sets a fixture up and
tears it down in different tasks: so the connection lives in a task of its own here.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest
from rawpeer import RawPeer
from support import Daemon, wait_for_memory

import gpud_client
from gpud.backends import cuda_available
from gpud.testing import spawn

HAVE_CUDA = cuda_available()

BACKENDS = [
    pytest.param("webgpu", id="webgpu"),
    pytest.param(
        "cuda",
        id="cuda",
        marks=[pytest.mark.cuda, pytest.mark.skipif(not HAVE_CUDA, reason="no CUDA device on this machine")],
    ),
]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests that ask for `cuda` by marker but get no device skip, whatever their parameters."""
    if HAVE_CUDA:
        return
    skip = pytest.mark.skip(reason="no CUDA device on this machine")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session", params=BACKENDS)
def daemon(request: pytest.FixtureRequest) -> Iterator[Daemon]:
    backend = request.param
    # One device: the tests of several devices (placement, copies between them) are test_devices.py's.
    with spawn.daemon(backend, extra_args=("--devices", "0")) as (address, proc):
        yield Daemon(address, proc, backend)
        assert proc.poll() is None, f"the {backend} daemon died during the tests (exit {proc.returncode})"
        # No leak across the whole run: every session is gone, so every buffer must be too.
        empty = {"memory_in_use": 0, "live_buffers": 0}
        asyncio.run(wait_for_memory(address, empty, timeout=30))


@pytest.fixture
def address(daemon: Daemon) -> str:
    return daemon.address


@pytest.fixture
def private_daemon() -> Iterator[Daemon]:
    """A daemon of this test's own (webgpu), for tests that kill or stop it."""
    with spawn.daemon("webgpu", extra_args=("--lease", "1")) as (address, proc):
        yield Daemon(address, proc, "webgpu")


class Connection:
    """A client whose connection (and task group) lives in a background task."""

    def __init__(self, address: str) -> None:
        self.address = address
        self._done = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def open(self) -> gpud_client.Client:
        ready: asyncio.Future[gpud_client.Client] = asyncio.get_running_loop().create_future()

        async def hold() -> None:
            try:
                async with gpud_client.connect(self.address) as gpu:
                    ready.set_result(gpu)
                    await self._done.wait()
            except BaseException as exc:
                if not ready.done():
                    ready.set_exception(exc)
                raise

        self._task = asyncio.create_task(hold())
        return await ready

    async def close(self) -> None:
        self._done.set()
        if self._task is not None:
            await self._task


@pytest.fixture
async def gpu(daemon: Daemon) -> AsyncIterator[gpud_client.Client]:
    connection = Connection(daemon.address)
    client = await connection.open()
    yield client
    await connection.close()
    daemon.assert_alive()


@pytest.fixture
async def raw(address: str) -> AsyncIterator[RawPeer]:
    """A raw ZeroMQ peer on the session-wide daemon (see tests/rawpeer.py)."""
    peer = RawPeer(address)
    try:
        yield peer
    finally:
        peer.close()

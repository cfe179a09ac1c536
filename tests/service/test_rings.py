"""The shared-memory fast path end to end (gpud.service.rings, ring_server; gpud_client.ring): results
equal ZeroMQ's whichever way each message goes, and whatever a client does to its own ring or the
ring socket ends at most its own session."""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import hostile_rings
import msgpack
import numpy as np
import pytest
import support
from support import Daemon

import gpud_client
import gpud_protocol as proto
from gpud.service import admin
from gpud.service.rings import BELL_BYTES
from gpud.testing import spawn
from gpud_client import u32
from gpud_client.errors import DaemonLost, SessionLost
from gpud_client.naps import KEPT
from gpud_protocol import ring as R


@pytest.fixture(scope="module")
def fake() -> Iterator[Daemon]:
    """A daemon of this module's own on the fake backend (its ring sessions spin it: not the shared one)."""
    with spawn.daemon("fake", extra_args=("--lease", "2")) as (address, proc):
        yield Daemon(address, proc, "fake")
        assert proc.poll() is None


async def _status(address: str) -> dict[str, Any]:
    return await anyio.to_thread.run_sync(admin.query, address)


async def _ring_sessions_come_to(address: str, count: int) -> None:
    """A bye has no answer and comes from another socket than the status query: wait for it to land."""
    with anyio.fail_after(10):
        while (await _status(address))["rings"]["ring_sessions"] != count:
            await anyio.sleep(0.02)


async def test_a_ring_session_gets_the_same_results_as_zeromq(daemon: Daemon) -> None:
    """On the session-wide daemon (webgpu here, cuda on a GPU): dispatch + readback, repeated."""
    async with gpud_client.connect(daemon.address, ring=True) as gpu:
        assert gpu.ring
        k = await support.axpb(gpu)
        x = gpu.tensor(np.arange(1000, dtype=np.float32))
        y = gpu.empty((1000,), "float32")
        for i in range(50):
            support.run_axpb(gpu, k, x, y, float(i), 1.0)
            support.assert_close(await y.numpy(), support.ref_axpb(np.arange(1000, dtype=np.float32), i, 1.0))
        x.free()
        y.free()
    daemon.assert_alive()


async def test_large_messages_go_by_zeromq_in_order_with_the_ring(fake: Daemon) -> None:
    """Uploads past the ring's largest message go by ZeroMQ; the daemon runs batches in number order."""
    async with gpud_client.connect(fake.address, ring=True) as gpu:
        assert gpu.ring
        k = await gpu.kernel("fake:scale", "scale")
        rng = np.random.default_rng(0)
        for i in range(20):
            big = rng.random(200_000 + 64 * i, dtype=np.float32)  # 800 KB: by ZeroMQ
            t = gpu.tensor(big)
            y = gpu.empty(t.shape, "float32")
            gpu.dispatch(k, (big.size // 64, 1, 1), [t, y, 2.0])  # by the ring, after the upload it reads
            small = gpu.tensor(np.full(8, i, np.float32))
            np.testing.assert_array_equal(await y.numpy(), big * 2)
            np.testing.assert_array_equal(await small.numpy(), np.full(8, i, np.float32))
            t.free()
            y.free()
            small.free()
        huge = rng.random(3 << 20, dtype=np.float32)  # 12 MB: a readback in several parts
        t = gpu.tensor(huge)
        np.testing.assert_array_equal(await t.numpy(), huge)
    stats = await _status(fake.address)
    assert stats["rings"]["rings_attached"] >= 1


async def test_what_a_ring_session_queued_before_closing_is_done(fake: Daemon) -> None:
    """The bye goes by ZeroMQ after the daemon confirmed every batch: it never overtakes the ring."""
    async with gpud_client.connect(fake.address, ring=True) as gpu:
        t = gpu.tensor(np.arange(16, dtype=np.float32))
        gpu.publish(t, "ring-published", mode="ro")
    async with gpud_client.connect(fake.address) as other:
        opened = await other.open("ring-published")
        np.testing.assert_array_equal(await opened.numpy(), np.arange(16, dtype=np.float32))
        opened.free()
        other.unpublish("ring-published")
        await other.sync()


async def test_a_large_reply_to_a_client_that_stopped_spinning_goes_by_the_ring_with_a_doorbell(fake: Daemon) -> None:
    """A readback of BELL_BYTES or more waits in the ring and only a doorbell crosses the socket; a small
    one still goes whole by ZeroMQ. Either way the client gets every reply, in order with its requests."""
    async with gpud_client.connect(fake.address, ring=True, spin_us=1) as gpu:  # asleep when replies come
        assert gpu.ring
        rng = np.random.default_rng(1)
        before = (await _status(fake.address))["rings"]["ring_bells_out"]
        for i in range(10):
            big = rng.random(BELL_BYTES // 4 + 1000 * i, dtype=np.float32)
            t, small = gpu.tensor(big), gpu.tensor(np.full(4, i, np.float32))
            np.testing.assert_array_equal(await t.numpy(), big)
            np.testing.assert_array_equal(await small.numpy(), np.full(4, i, np.float32))
            t.free()
            small.free()
        rings = (await _status(fake.address))["rings"]
        assert rings["ring_bells_out"] - before == 10  # the large readbacks alone
    fake.assert_alive()


async def test_after_answering_a_long_request_the_daemon_polls_that_ring_again() -> None:
    """A request longer than the daemon's ring spin lets it fall asleep; its reply starts the polling
    again, so the client's next request goes by the ring without a doorbell."""
    with spawn.daemon("fake", extra_args=("--ring-spin-us", "20000")) as (address, _proc):
        async with gpud_client.connect(address, ring=True) as gpu:
            assert gpu.ring
            spin = await gpu.kernel("fake:spin", "spin")
            busy = gpu.empty(64)
            await busy.numpy()
            before = (await _status(address))["counters"].get("doorbells", 0)
            for _ in range(3):  # each 100 ms: the daemon sleeps after its 20 ms spin
                gpu.dispatch(spin, 1, [busy, u32(100)])
                await busy.numpy()
            assert (await _status(address))["counters"].get("doorbells", 0) - before <= 1  # the first's alone


async def test_a_replay_longer_than_the_spin_is_awaited_asleep_then_spinning_at_its_end(fake: Daemon) -> None:
    """A replay that takes 20 ms where the client spins 5: once the graph's last replies showed how long
    it takes, the client sleeps through most of it and spins when it is due, so the reply comes by the
    ring it polls (not by ZeroMQ after the spin, which has to wake the client)."""
    async with gpud_client.connect(fake.address, ring=True, spin_us=5000) as gpu:
        assert gpu.ring
        spin = await gpu.kernel("fake:spin", "spin")
        g = gpu.graph("twenty-ms")
        x = g.input("x", (64,), "float32")
        g.dispatch(spin, 1, [x, u32(20)])
        g.output("x", x)
        step = await g.build()
        values = np.arange(64, dtype=np.float32)
        for _ in range(KEPT):  # how long it takes
            np.testing.assert_array_equal((await step.replay(x=values))["x"], values)
        before = (await _status(fake.address))["rings"]["ring_replies_out"]
        for _ in range(5):
            np.testing.assert_array_equal((await step.replay(x=values))["x"], values)
        assert (await _status(fake.address))["rings"]["ring_replies_out"] - before >= 4
        step.free()


async def test_a_daemon_without_rings_serves_a_client_that_asks_for_one() -> None:
    with spawn.daemon("fake", extra_args=("--ring-bytes", "0")) as (address, _proc):
        assert not Path(address[len("ipc://") :] + ".ring").exists()
        async with gpud_client.connect(address, ring=True) as gpu:
            assert not gpu.ring
            t = gpu.tensor(np.ones(4, np.float32))
            np.testing.assert_array_equal(await t.numpy(), np.ones(4, np.float32))


# --------------------------------------------------------------------------- hostile clients


async def _bystanders_work(address: str) -> None:
    for ring in (False, True):
        async with gpud_client.connect(address, ring=ring) as gpu:
            assert gpu.ring == ring
            t = gpu.tensor(np.arange(8, dtype=np.float32))
            np.testing.assert_array_equal(await t.numpy(), np.arange(8, dtype=np.float32))


@pytest.mark.parametrize(
    "damage",
    ["written_far_ahead", "record_head_lies", "lengths_lie", "reply_read_ahead", "batch_numbers_skip_back"],
)
async def test_a_client_that_breaks_its_own_ring_loses_only_its_session(fake: Daemon, damage: str) -> None:
    with pytest.raises((SessionLost, DaemonLost, gpud_client.GpudError)):
        async with gpud_client.connect(fake.address, ring=True) as gpu:
            t = gpu.tensor(np.arange(8, dtype=np.float32))
            await t.numpy()
            connection = gpu._connection
            ring = connection.ring
            assert ring is not None
            connection.ring = None  # from here on this client speaks ZeroMQ alone; the damage stays
            requests = ring.requests
            words, own, capacity = requests._words, requests._own, requests.capacity
            if damage == "written_far_ahead":
                words[R.REQUEST_WRITTEN] = own + (1 << 40)
            elif damage == "record_head_lies":
                struct.pack_into("<II", requests._data, own % capacity, 1 << 30, 1)
                words[R.REQUEST_WRITTEN] = own + 64
            elif damage == "lengths_lie":
                hostile_rings.publish_lying_lengths(requests, 999)
            elif damage == "reply_read_ahead":
                words[R.REPLY_READ] = 1 << 50
                ring.replies.set_slot(R.CLIENT_POLLS_UNTIL, 1 << 62)  # asks for its replies in the ring
            else:  # a batch whose number was used already
                requests.produce([proto.encode_ops([proto.FlushOp(10**6)], 0, number=1)])
            connection._send_control(proto.DOORBELL)
            for _ in range(100):
                await gpu.stats()  # ends in SessionLost once the daemon has ended the session
    fake.assert_alive()
    await _bystanders_work(fake.address)
    await _ring_sessions_come_to(fake.address, 0)


def _ask(path: str, request: bytes) -> tuple[dict[str, object] | None, list[int]]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(5)
        conn.connect(path)
        if request:
            conn.sendall(request)
        data, fds, _, _ = socket.recv_fds(conn, 512, 4)
    answer = msgpack.unpackb(data, raw=False) if data else None
    return answer, fds


async def test_the_ring_socket_gives_a_ring_to_the_session_alone(fake: Daemon) -> None:
    path = fake.address[len("ipc://") :] + ".ring"
    async with gpud_client.connect(fake.address) as gpu:
        session, key = gpu.session_id, str(gpu.welcome["key"])
        for request in (
            msgpack.packb({"session": session, "key": "0" * len(key)}),  # a wrong key
            msgpack.packb({"session": "nobody", "key": key}),
            msgpack.packb(["not", "a", "map"]),
            b"\xc1garbage",
            msgpack.packb({"session": session, "key": 7}),
        ):
            answer, fds = _ask(path, request)
            assert answer is not None and answer["ok"] is False and fds == []
        # a connection that says nothing is closed after a while, and costs nobody anything meanwhile
        silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        silent.connect(path)
        t = gpu.tensor(np.ones(4, np.float32))
        np.testing.assert_array_equal(await t.numpy(), np.ones(4, np.float32))
        silent.settimeout(5)
        assert silent.recv(16) == b""
        silent.close()
        answer, fds = _ask(path, msgpack.packb({"session": session, "key": key}))
        assert answer is not None and answer["ok"] is True and len(fds) == 1
        # the segment is sealed: the client cannot shrink it under the daemon
        with pytest.raises(PermissionError):
            os.ftruncate(fds[0], 4096)
        for fd in fds:
            os.close(fd)
    fake.assert_alive()


@pytest.mark.parametrize(("environment", "spin_s"), [(None, 1e-3), ("100", 1e-4), ("0", 1e-3)])
async def test_a_ring_session_spins_as_gpud_spin_us_says(
    fake: Daemon, monkeypatch: pytest.MonkeyPatch, environment: str | None, spin_s: float
) -> None:
    """1,000 µs by default; GPUD_SPIN_US sets it (0: the default); connect(spin_us=...) wins over both."""
    if environment is None:
        monkeypatch.delenv("GPUD_SPIN_US", raising=False)
    else:
        monkeypatch.setenv("GPUD_SPIN_US", environment)
    async with gpud_client.connect(fake.address, ring=True) as gpu:
        assert gpu.ring and gpu._connection._spin_s == pytest.approx(spin_s)
    async with gpud_client.connect(fake.address, ring=True, spin_us=20) as gpu:
        assert gpu._connection._spin_s == pytest.approx(2e-5)

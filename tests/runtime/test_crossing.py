"""A copy between devices, peer to peer, ordered by markers on the (fake) devices (`gpud.runtime.crossing`)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from gpud.backends.base import SubmissionFailed
from gpud.backends.fake import FakeDevice
from gpud.runtime.runtime import DeviceRuntime
from gpud_protocol import ArgKind
from gpud_protocol.errors import InvalidArgument
from runtime.test_runtime import Owner, Settings, _program, read

N = 4096


def _pair() -> tuple[DeviceRuntime, DeviceRuntime]:
    loop = asyncio.get_running_loop()
    a, b = (DeviceRuntime(FakeDevice(i, loop), Settings(), lambda _rt, _error: None) for i in (0, 1))
    a.neighbours = b.neighbours = [a, b]
    return a, b


async def test_the_copy_follows_the_targets_earlier_work_and_the_host_never_waits_for_it() -> None:
    """The target is busy (a 300 ms kernel, then a write of the destination): the copy is ordered after
    both on the devices, and the session may go on long before the target's work has completed."""
    a, b = _pair()
    owner = Owner()
    src = a.alloc(4 * N)
    a.upload(src, memoryview(np.arange(N, dtype=np.float32).tobytes()), owner)
    dst, scratch = b.alloc(4 * N), b.alloc(64)
    spin, axpb = await _program(b, "spin"), await _program(b, "axpb")
    b.dispatch(b.prepare(spin, (1, 1, 1), [scratch, (ArgKind.U32, 300)]), owner)
    ones = b.alloc(4 * N)
    b.upload(ones, memoryview(np.ones(N, np.float32).tobytes()), owner)
    b.dispatch(
        b.prepare(axpb, (N // 64, 1, 1), [ones, dst, (ArgKind.F32, 0.0), (ArgKind.F32, 7.0), (ArgKind.U32, N)]), owner
    )
    busy_until = b.ledger.pending_index
    wait = a.copy_to(src, b, dst, owner)
    await asyncio.wait_for(wait.ready, 5)
    assert wait.resume() is None
    assert b.ledger.completed < busy_until  # ordered without waiting for the target's work
    assert a.counters["peer_copy_bytes"] == 4 * N and not a.counters["host_copy_bytes"]
    got = np.frombuffer(await read(b, dst, owner), np.float32)
    np.testing.assert_array_equal(got, np.arange(N, dtype=np.float32))  # not the 7s written before it
    await a.close()
    await b.close()


async def test_later_writes_of_the_source_and_reads_of_the_destination_keep_their_place() -> None:
    a, b = _pair()
    owner = Owner()
    axpb_a, axpb_b = await _program(a, "axpb"), await _program(b, "axpb")
    x = np.arange(N, dtype=np.float32)
    src, dst, out = a.alloc(4 * N), b.alloc(4 * N), b.alloc(4 * N)
    a.upload(src, memoryview(x.tobytes()), owner)
    for step in range(4):
        wait = a.copy_to(src, b, dst, owner)
        await wait.ready
        wait.resume()
        a.dispatch(
            a.prepare(axpb_a, (N // 64, 1, 1), [src, src, (ArgKind.F32, 2.0), (ArgKind.F32, 0.0), (ArgKind.U32, N)]),
            owner,
        )
        b.dispatch(
            b.prepare(axpb_b, (N // 64, 1, 1), [dst, out, (ArgKind.F32, 1.0), (ArgKind.F32, 1.0), (ArgKind.U32, N)]),
            owner,
        )
        got = np.frombuffer(await read(b, out, owner), np.float32)
        np.testing.assert_array_equal(got, x * 2.0**step + 1.0)
    await a.close()
    await b.close()


async def test_buffers_released_while_the_copy_is_in_flight_wait_for_it() -> None:
    """A session that ends mid-copy releases its buffers: they are held until the copy marked its use."""
    a, b = _pair()
    owner = Owner()
    src, dst, scratch = a.alloc(4 * N), b.alloc(4 * N), b.alloc(64)
    spin = await _program(b, "spin")
    b.dispatch(b.prepare(spin, (1, 1, 1), [scratch, (ArgKind.U32, 200)]), owner)
    wait = a.copy_to(src, b, dst, owner)
    a.release(src)
    b.release(dst)
    assert b.live_buffers == 2 and a.live_buffers == 1  # held: the copy's parts are not all issued yet
    await wait.ready
    await a.synchronize()
    await b.synchronize()
    b.release(scratch)
    await b.synchronize()
    assert a.live_buffers == b.live_buffers == 0 and a.memory_in_use == b.memory_in_use == 0
    assert not a._holds and not b._holds and not a._held and not b._held
    await a.close()
    await b.close()


async def test_a_refused_part_fails_the_copy_and_lets_go_of_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = _pair()
    owner = Owner()
    src, dst = a.alloc(4 * N), b.alloc(4 * N)
    dropped: list[object] = []
    monkeypatch.setattr(a.device, "drop_marker", dropped.append)
    monkeypatch.setattr(b.device, "drop_marker", dropped.append)

    def refuse(_commands: object) -> object:
        raise RuntimeError("refused")

    monkeypatch.setattr(a.device, "submit", refuse)
    wait = a.copy_to(src, b, dst, owner)
    with pytest.raises(SubmissionFailed, match="refused"):
        await asyncio.wait_for(wait.ready, 5)
    for _ in range(100):
        if len(dropped) == 2:
            break
        await asyncio.sleep(0.01)
    assert len(dropped) == 2  # both markers, once nothing that waits on them can run
    monkeypatch.undo()
    assert not a._holds and not b._holds
    await a.close()
    await b.close()


async def test_the_fake_device_refuses_a_wait_on_a_mark_not_yet_issued() -> None:
    """Where CUDA would silently not wait, the fake says the ordering protocol was broken."""
    loop = asyncio.get_running_loop()
    a, b = FakeDevice(0, loop), FakeDevice(1, loop)
    marker = a.new_marker()
    b.encode_wait(marker)
    with pytest.raises(InvalidArgument, match="not issued"):
        b.submit(b.take_commands())
    a.encode_mark(marker)
    a.submit(a.take_commands())
    b.encode_wait(marker)
    b.submit(b.take_commands())
    a.close()
    b.close()

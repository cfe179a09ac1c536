"""systemd's notify protocol: READY=1 once serving, STATUS=, WATCHDOG=1, and STOPPING=1 then a drain."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
from pathlib import Path

import anyio
import numpy as np
import pytest
from support import axpb, ref_axpb, run_axpb

import gpud_client
from gpud.service.notify import Notifier, watchdog_interval
from gpud.testing import spawn
from gpud_client import Busy, SessionLost, u32


def _listener(tmp_path: Path) -> spawn.NotifyListener:
    return spawn.NotifyListener(tmp_path / "notify.sock")


def test_a_datagram_reaches_a_path_socket(tmp_path: Path) -> None:
    listener = _listener(tmp_path)
    try:
        assert Notifier(str(listener.path)).send("READY=1", "STATUS=two\nlines")
        (message,) = listener.poll(1.0)
        assert message["READY"] == "1" and message["STATUS"] == "two lines"
    finally:
        listener.close()


def test_an_abstract_socket_name_starting_with_at() -> None:
    name = f"gpud-test-{os.getpid()}-{time.monotonic_ns()}"
    receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    receiver.bind("\0" + name)
    try:
        assert Notifier("@" + name).send("WATCHDOG=1")
        receiver.settimeout(1.0)
        assert receiver.recv(100) == b"WATCHDOG=1"
    finally:
        receiver.close()


def test_without_a_listener_nothing_blocks_or_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert not Notifier().enabled and not Notifier().send("READY=1")
    assert not Notifier(str(tmp_path / "nobody.sock")).send("READY=1")
    listener = _listener(tmp_path)  # a listener that never reads: its queue fills, sends must not block
    try:
        notifier = Notifier(str(listener.path))
        t0 = time.monotonic()
        results = [notifier.send("STATUS=" + "x" * 1000) for _ in range(5000)]
        assert time.monotonic() - t0 < 2.0
        assert results[0] and not results[-1]
    finally:
        listener.close()


def test_watchdog_interval_is_half_of_watchdog_usec(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    assert watchdog_interval() is None
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    assert watchdog_interval() == 15.0
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert watchdog_interval() == 15.0
    monkeypatch.setenv("WATCHDOG_PID", "1")  # meant for another process
    assert watchdog_interval() is None


def test_ready_only_once_the_socket_answers(tmp_path: Path) -> None:
    listener = _listener(tmp_path)
    try:
        with spawn.daemon("fake", notify=listener) as (address, proc):
            ready = listener.messages[0]
            assert ready["READY"] == "1" and proc.poll() is None
            assert "2 device(s)" in str(ready["STATUS"]) and "healthy" in str(ready["STATUS"])
            assert not any("READY" in m for m in listener.messages[1:])
            assert spawn.answers(address)
            assert Path(address.removeprefix("ipc://")).stat().st_mode & 0o777 == 0o660
    finally:
        listener.close()


def test_status_and_watchdog_are_sent_while_serving(tmp_path: Path) -> None:
    listener = _listener(tmp_path)
    try:
        env = {"WATCHDOG_USEC": "200000"}  # a ping every 0.1 s
        with spawn.daemon("fake", notify=listener, env=env):
            pings = [listener.wait_for("WATCHDOG", 3.0)["_at"] for _ in range(5)]
            status = listener.wait_for("STATUS", 4.0)
        assert str(status["STATUS"]).startswith("serving: 2 device(s), 0 session(s), 0 op(s) queued")
        assert float(pings[-1]) - float(pings[0]) < 2.0
    finally:
        listener.close()


async def test_sigterm_stops_new_work_and_finishes_what_was_accepted(tmp_path: Path) -> None:
    """STOPPING=1 at once; new sessions and new batches get Busy; an accepted readback still
    completes with its data; the daemon exits 0 as soon as the work is done, well before the timeout."""
    listener = _listener(tmp_path)
    try:
        with spawn.daemon("fake", notify=listener, extra_args=("--drain-timeout-s", "8")) as (address, proc):
            async with gpud_client.connect(address, device=0) as gpu:
                spin = await gpu.kernel("fake:spin", "spin")
                k = await axpb(gpu)
                x = np.arange(256, dtype=np.float32)
                tx, ty, busy = gpu.tensor(x), gpu.empty(256), gpu.empty(64)
                gpu.dispatch(spin, 1, [busy, u32(1500)])  # holds device 0 for 1.5 s
                run_axpb(gpu, k, tx, ty, 2.0, 1.0)
                pending = asyncio.ensure_future(ty.numpy())
                await anyio.sleep(0.3)  # the readback is in the daemon, behind the spin
                t0 = time.monotonic()
                proc.send_signal(signal.SIGTERM)
                stopping = await asyncio.to_thread(listener.wait_for, "STOPPING", 2.0)
                assert "stopping" in str(stopping["STATUS"])
                with pytest.raises(Busy, match="the daemon is stopping"):
                    async with gpud_client.connect(address):
                        pass
                with pytest.raises(Busy, match="the daemon is stopping"):
                    await gpu.stats()
                np.testing.assert_array_equal(await pending, ref_axpb(x, 2.0, 1.0))
            await asyncio.to_thread(proc.wait, 10)
        assert proc.returncode == 0
        assert time.monotonic() - t0 < 5.0, "the drain waited longer than the work"
    finally:
        listener.close()


async def test_a_drain_that_times_out_answers_every_waiting_request(tmp_path: Path) -> None:
    args = ("--drain-timeout-s", "0.3")
    with spawn.daemon("fake", extra_args=args) as (address, proc):
        async with gpud_client.connect(address, device=0) as gpu:
            spin = await gpu.kernel("fake:spin", "spin")
            y = gpu.empty(64)
            gpu.dispatch(spin, 1, [y, u32(1500)])
            pending = asyncio.ensure_future(y.numpy())
            await anyio.sleep(0.2)
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            with pytest.raises(SessionLost, match="drain"):
                await pending
            assert time.monotonic() - t0 < 1.2  # the drain's 0.3 s, not the 1.5 s of work
        await asyncio.to_thread(proc.wait, 10)
    assert proc.returncode == 0

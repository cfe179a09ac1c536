"""Health by progress: pending work that stops completing makes the daemon unhealthy, says where,
and stops the watchdog; it is healthy again once work completes."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

import gpud_client
from gpud.runtime.ledger import CompletionLedger
from gpud.service import admin
from gpud.service.health import assess
from gpud.testing import spawn
from gpud_client import u32


class _Runtime:
    def __init__(self, index: int) -> None:
        self.index = index
        self.ledger = CompletionLedger(lambda error: None)


def test_the_ledger_measures_pending_work_without_completions(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [100.0]
    monkeypatch.setattr("gpud.runtime.ledger.time.monotonic", lambda: clock[0])
    ledger = CompletionLedger(lambda error: None)
    assert ledger.stalled_for(clock[0]) == 0.0  # idle is healthy, however long
    clock[0] = 500.0
    ledger.next_submission()  # submitted long after the last completion: counts from the submit
    ledger.next_submission()
    assert ledger.stalled_for(503.0) == 3.0
    clock[0] = 504.0
    ledger.complete(1)  # progress: counts from this completion
    assert ledger.stalled_for(505.0) == 1.0
    ledger.complete(2)
    assert ledger.stalled_for(600.0) == 0.0


def test_assess_names_the_device_and_how_long(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("gpud.runtime.ledger.time.monotonic", lambda: 10.0)
    runtimes = [_Runtime(0), _Runtime(1)]
    runtimes[1].ledger.next_submission()
    assert assess(runtimes, 5.0, 12.0).healthy
    health = assess(runtimes, 5.0, 17.5)
    assert not health.healthy and health.stalled == (0.0, 7.5)
    (problem,) = health.problems
    assert problem.startswith("device 1: 1 submission(s) pending and none completed for 7.5 s")
    assert "UNHEALTHY: device 1" in health.summary()
    assert not assess(runtimes[:1], 5.0, 12.0, fatal=RuntimeError("gone")).healthy


async def _status(address: str) -> dict[str, Any]:
    return await asyncio.to_thread(admin.query, address, 3.0)


async def test_a_hung_device_is_unhealthy_and_stops_the_watchdog(tmp_path: Path) -> None:
    listener = spawn.NotifyListener(tmp_path / "notify.sock")
    env = {"WATCHDOG_USEC": "200000"}  # a ping every 0.1 s while healthy
    args = ("--health-stall-s", "0.5")
    try:
        with spawn.daemon("fake", notify=listener, env=env, extra_args=args) as (address, _proc):
            await asyncio.to_thread(listener.wait_for, "WATCHDOG", 3.0)
            assert (await _status(address))["health"]["healthy"]
            async with gpud_client.connect(address, device=1) as gpu:
                spin = await gpu.kernel("fake:spin", "spin")
                y = gpu.empty(64)
                gpu.dispatch(spin, 1, [y, u32(3000)])  # device 1 hangs for 3 s
                done = asyncio.ensure_future(y.numpy())

                status = await asyncio.to_thread(listener.wait_for, "STATUS", 3.0)
                while "UNHEALTHY" not in str(status["STATUS"]):
                    status = await asyncio.to_thread(listener.wait_for, "STATUS", 3.0)
                assert "device 1" in str(status["STATUS"])
                listener.poll()  # from here on, while it hangs, no ping may come
                window = time.monotonic()

                snapshot = await _status(address)
                assert not snapshot["health"]["healthy"]
                (problem,) = snapshot["health"]["problems"]
                assert problem.startswith("device 1: 1 submission(s) pending and none completed for ")
                assert snapshot["devices"][1]["stalled_s"] >= 0.5 and snapshot["devices"][0]["stalled_s"] == 0
                cli = await asyncio.to_thread(
                    subprocess.run,
                    [sys.executable, "-m", "gpud", "status", "--address", address],
                    capture_output=True,
                    text=True,
                    timeout=30,
                )
                assert cli.returncode == 1, cli.stderr
                assert "health: UNHEALTHY" in cli.stdout and "device 1: 1 submission(s) pending" in cli.stdout

                await anyio.sleep(max(0.0, 0.8 - (time.monotonic() - window)))
                assert not [m for m in listener.poll() if "WATCHDOG" in m], "a watchdog ping while unhealthy"

                await done  # the spin ends: work completes
                ping = await asyncio.to_thread(listener.wait_for, "WATCHDOG", 3.0)
                assert float(ping["_at"]) > window
                assert (await _status(address))["health"] == {"healthy": True, "problems": [], "stall_s": 0.5}
    finally:
        listener.close()

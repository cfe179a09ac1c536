"""Memory kept for reuse goes back after `pool_idle_release_s` (gpud.runtime.idle), on the fake
backend with a virtual clock."""

from __future__ import annotations

import asyncio
import dataclasses
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from gpud.backends.fake import FakeDevice
from gpud.runtime import pools as pools_module
from gpud.runtime.runtime import DeviceRuntime
from runtime.test_runtime import Owner, Settings, drive, read


async def test_staging_left_idle_after_a_burst_is_released(monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: after batches of a model on lavapipe the daemon held 128 MiB of idle staging
    (and its RSS) for good while it reported 0 B in use."""
    clock = SimpleNamespace(now=0.0)
    monkeypatch.setattr(pools_module, "time", SimpleNamespace(monotonic=lambda: clock.now))
    device = FakeDevice(0, asyncio.get_running_loop(), 64 << 20)
    destroyed: list[Any] = []
    monkeypatch.setattr(device, "destroy_staging", destroyed.append)
    rt = DeviceRuntime(device, dataclasses.replace(Settings(), pool_idle_release_s=30.0), lambda _rt, _e: None)
    assert rt.idle.period_s <= 30.0 / 4  # the tick is scheduled, a few times per idle period
    owner = Owner()
    data = np.arange(1 << 18, dtype=np.uint8)  # a few staging buffers each way
    buffer = rt.alloc(data.nbytes)
    await drive(rt.upload(buffer, memoryview(data.tobytes()), owner))
    assert await read(rt, buffer, owner) == data.tobytes()
    await rt.synchronize()
    held = rt.uploads.bytes_total + rt.downloads.bytes_total
    assert held > 0 and rt.uploads.in_use == rt.downloads.in_use == 0

    clock.now = 29.0
    assert rt.idle.release() == 0  # not idle long enough
    clock.now = 31.0
    while rt.idle.release():  # a few buffers per tick
        pass
    assert rt.uploads.bytes_total == rt.downloads.bytes_total == 0
    await rt.synchronize()  # the destroys run on the submit worker, in order with submissions
    while len(destroyed) < rt.uploads.released + rt.downloads.released:
        await asyncio.sleep(0.001)
    assert rt.stats()["upload_staging"]["released"] >= 1 and rt.stats()["download_staging"]["released"] >= 1
    assert await read(rt, buffer, owner) == data.tobytes()  # the pools make new ones when asked
    await rt.close()

"""The webgpu device's completion waits: every map wait reports once and leaves nothing behind."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

wgpu = pytest.importorskip("wgpu")

from gpud.backends.webgpu.device import _Receiver  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _device() -> Any:
    adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    if adapter is None:
        pytest.skip("no WebGPU adapter")
    return adapter.request_device_sync()


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_map_waits_report_once_and_keep_no_promise(loop_kind: str) -> None:
    if loop_kind == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        runner: Any = uvloop.run
    else:
        runner = asyncio.run
    device = _device()
    usage = wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST
    buffer = device.create_buffer(size=4, usage=usage)

    async def main() -> tuple[list[str], int]:
        outcomes: list[str] = []
        loop = asyncio.get_running_loop()
        before = len(wgpu.GPUPromise._UNRESOLVED)
        for _ in range(200):
            settled: asyncio.Future[None] = loop.create_future()

            def ok(_result: Any, settled: asyncio.Future[None] = settled) -> None:
                outcomes.append("ok")
                settled.set_result(None)

            def failed(_error: Exception, settled: asyncio.Future[None] = settled) -> None:
                outcomes.append("failed")
                settled.set_result(None)

            buffer.map_async("READ_NOSYNC", 0, 4)._chain(_Receiver(ok, failed))
            await asyncio.wait_for(settled, 10)
            buffer.unmap()
        last: asyncio.Future[str] = loop.create_future()
        pending = buffer.map_async("READ_NOSYNC", 0, 4)
        pending._chain(_Receiver(lambda _r: last.set_result("ok"), lambda _e: last.set_result("failed")))
        buffer.destroy()  # the map is aborted: the error side reports
        outcomes.append(await asyncio.wait_for(last, 10))
        return outcomes, len(wgpu.GPUPromise._UNRESOLVED) - before

    outcomes, kept = runner(main())
    assert outcomes == ["ok"] * 200 + ["failed"]
    assert kept <= 0

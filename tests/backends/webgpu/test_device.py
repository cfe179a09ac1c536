"""The webgpu device's completion waits: every map wait reports once and leaves nothing behind."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
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


def test_completions_are_reported_in_submission_order() -> None:
    from gpud.backends.webgpu.reports import OrderedReports

    reports = OrderedReports()
    seen: list[tuple[int, BaseException | None]] = []

    def reporter(i: int) -> Callable[[BaseException | None], None]:
        return lambda error: seen.append((i, error))

    settles = [reports.add(reporter(i)) for i in range(3)]
    failure = RuntimeError("x")
    settles[2](None)
    settles[1](failure)
    assert seen == []
    settles[1](None)  # a second outcome is ignored
    settles[0](None)
    assert seen == [(0, None), (1, failure), (2, None)]
    assert len(reports) == 0


def test_a_later_map_never_releases_an_earlier_submissions_reads() -> None:
    """Regression (H100 through Vulkan, 8 clients reading back at once): submission N + 1's map
    settled before N's, the runtime took N as done and read N's staging while its map was pending
    ("Can only read from a buffer if its mapped"), failing readbacks as a lost device. Now reports
    keep submission order, and a failed map fails that staging's read alone."""
    from types import SimpleNamespace

    from gpud.backends.webgpu.device import WebGpuDevice

    adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    if adapter is None:
        pytest.skip("no WebGPU adapter")
    settings = SimpleNamespace(
        max_dispatches_per_flush=64, limits=SimpleNamespace(max_graph_steps=64), bind_group_cache_size=16
    )

    async def main() -> None:
        device = WebGpuDevice(0, asyncio.get_running_loop(), adapter, settings)
        waits: list[tuple[Any, Any, Any]] = []
        device._when_settled = lambda promise, ok, failed: waits.append((promise, ok, failed))  # type: ignore[method-assign]
        src = device.alloc(16)
        stagings = [device.make_staging(16, False) for _ in range(3)]
        reports: list[tuple[int, BaseException | None]] = []
        for i, staging in enumerate(stagings):
            device.encode_download(src, 0, staging, 16)
            submitted = device.submit(device.take_commands())
            device.watch(submitted, functools.partial(lambda i, error: reports.append((i, error)), i), True)
        for _ in range(1000):  # the real maps settle; only the chained reports are held back
            if all(s.map_state == "mapped" for s in stagings):
                break
            await asyncio.sleep(0.005)
        waits[2][1](None)
        waits[1][1](None)
        assert reports == [], "a later submission's map released earlier reads"
        waits[0][2](RuntimeError("map aborted"))
        assert reports == [(0, None), (1, None), (2, None)]
        with pytest.raises(RuntimeError, match="mapping it failed"):
            device.read_staging(stagings[0], 16)
        assert bytes(device.read_staging(stagings[1], 16)) == bytes(16)
        for staging in stagings:
            device.destroy_staging(staging)
        device.free(src)
        device.close()

    asyncio.run(main())


def test_freed_buffers_leave_no_bind_group_keys_behind() -> None:
    """Regression (the lavapipe soak: wgpu buffer objects and RSS grew): freeing a buffer dropped its
    bind groups but left their keys in the sets of the other buffers bound with it, so a long-lived
    buffer (weights) kept a key, and through it the freed buffer, for every combination it was in."""
    from gpud.backends.webgpu.dispatch import Dispatcher

    class Stub:
        def create_buffer(self, **_: Any) -> object:
            return object()

        def create_bind_group(self, **_: Any) -> object:
            return object()

    dispatcher = Dispatcher(Stub(), 4, 64, 1 << 30)
    weights = object()
    for _ in range(100):
        scratch = object()
        dispatcher.bind_group(object(), 1, [(weights, 0, 16), (scratch, 0, 16)], 0)
        dispatcher.forget_buffer(scratch)
    assert not dispatcher._keys_of_buffer, "freed buffers are still reachable through other buffers' keys"


def test_dispatches_with_the_same_scalars_share_a_uniform_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    """One slot per distinct scalar bytes in a command buffer: the slot, part of a bind group's key,
    then repeats from one command buffer to the next (a decode step's bind groups are found again)."""
    from gpud.backends.webgpu import dispatch
    from gpud_protocol import ArgKind

    bound: list[int] = []
    monkeypatch.setattr(dispatch, "_SET_PIPELINE", lambda _compute, _pipeline: None)
    monkeypatch.setattr(dispatch, "_SET_BIND_GROUP", lambda _compute, group: bound.append(group))
    monkeypatch.setattr(dispatch, "_DISPATCH", lambda _compute, _x, _y, _z: None)

    class Stub:
        def create_buffer(self, **_: Any) -> object:
            return object()

        def create_bind_group(self, **kwargs: Any) -> int:
            offset: int = kwargs["entries"][-1]["resource"]["offset"]  # the uniform slot's
            return offset

    dispatcher = dispatch.Dispatcher(Stub(), 8, 64, 1 << 30)
    packer = dispatch.scalar_struct((int(ArgKind.U32), int(ArgKind.F32)))
    tensors = ((object(), 0, 16),)
    for values in [(4, 1.0), (4, 1.0), (5, 1.0), (4, 1.0), (4, -0.0), (4, 0.0)]:
        dispatcher.encode(
            None, ("pipeline", "layout", 1, tensors, packer, values, (1, 1, 1), packer.pack(*values)), [None]
        )
    slot = dispatch.SLOT_BYTES
    assert bound == [0, 0, slot, 0, 2 * slot, 3 * slot]  # -0.0 has other bytes than 0.0: a slot of its own
    uniforms = dispatcher.take_uniforms()
    assert uniforms is not None and len(uniforms) == 4 * slot
    assert uniforms[2 * slot : 2 * slot + 8] == packer.pack(4, -0.0)
    dispatcher.encode(
        None, ("pipeline", "layout", 1, tensors, packer, (5, 1.0), (1, 1, 1), packer.pack(5, 1.0)), [None]
    )
    assert bound[-1] == 0 and dispatcher.used == 1  # a new command buffer numbers its slots afresh

"""DeviceRuntime over the fake backend, in process: no GPU, no daemon."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import numpy as np
import pytest

from gpud.backends.base import Buffer, SubmissionFailed
from gpud.backends.fake import FakeDevice
from gpud.runtime.runtime import DeviceRuntime, Wait
from gpud_protocol import ArgKind, KernelOptions
from gpud_protocol.errors import DeviceLost, GpudError


@dataclasses.dataclass(frozen=True)
class Settings:
    max_dispatches_per_flush: int = 64
    submission_target_s: float = 1.0
    pool_idle_release_s: float = 0.0  # the tests that release idle memory call it themselves
    flush_deadline_ms: float = 1.0
    max_submissions_in_flight: int = 4
    staging_pool_bytes: int = 1 << 20
    reuse_memory_bytes: int = 1 << 20
    kernel_cache_size: int = 8


class Owner:
    def __init__(self) -> None:
        self.lost: list[GpudError] = []

    def work_lost(self, error: GpudError) -> None:
        self.lost.append(error)


def make(settings: Settings = Settings(), memory: int = 64 << 20) -> tuple[DeviceRuntime, list[DeviceLost]]:
    lost: list[DeviceLost] = []
    device = FakeDevice(0, asyncio.get_running_loop(), memory)
    return DeviceRuntime(device, settings, lambda _rt, error: lost.append(error)), lost


async def drive(wait: Wait | None) -> None:
    while wait is not None:
        await wait.ready
        wait = wait.resume()


async def read(rt: DeviceRuntime, buffer: Buffer, owner: Owner) -> bytes:
    parts: dict[int, bytes] = {}
    done = asyncio.get_running_loop().create_future()
    count = rt.parts(buffer.nbytes)

    def deliver(part: int, data: Any, error: BaseException | None) -> None:
        if error is not None:
            done.set_exception(error)
            return
        parts[part] = bytes(data)
        if len(parts) == count:
            done.set_result(None)

    await drive(rt.download(buffer, deliver, owner))
    rt.flush()
    await done
    return b"".join(parts[i] for i in range(count))


async def test_upload_then_download_in_chunks_through_a_small_pool() -> None:
    rt, _ = make()
    owner = Owner()
    data = np.random.default_rng(1).integers(0, 256, 3 << 20, dtype=np.uint8)  # 6x a pool half
    buffer = rt.alloc(data.nbytes)
    await drive(rt.upload(buffer, memoryview(data.tobytes()), owner))  # waits for staging to come back
    assert await read(rt, buffer, owner) == data.tobytes()
    assert rt.uploads.bytes_total <= rt.uploads.capacity_bytes
    assert rt.uploads.exhausted_waits > 0
    await rt.close()


async def test_a_buffer_is_freed_only_after_the_work_using_it_completed() -> None:
    rt, _ = make()
    owner = Owner()
    device: Any = rt.device
    buffer = rt.alloc(1 << 16)
    program = await _program(rt, "spin")
    rt.dispatch(rt.prepare(program, (1, 1, 1), [buffer, (ArgKind.U32, 50)]), owner)  # holds the device 50 ms
    rt.flush()
    rt.release(buffer)
    assert device.used == 1 << 16 and rt.live_buffers == 1  # still in use by the GPU
    await rt.synchronize()
    assert device.used == 0 and rt.live_buffers == 0 and rt.memory_in_use == 0
    await rt.close()


async def test_a_buffer_used_through_a_view_is_freed_only_after_that_work_completed() -> None:
    """Regression: a dispatch through a view (a tensor narrowed at an offset) marked the view as used,
    not its allocation: releasing the tensor then freed memory the pending dispatch still read."""
    rt, _ = make()
    owner = Owner()
    buffer = rt.alloc(1 << 16)
    program = await _program(rt, "spin")
    view = rt.view(rt.view(buffer, 256, 4096), 256, 1024)  # a view of a view: of the allocation
    assert view.base is buffer and view.offset == 512
    rt.dispatch(rt.prepare(program, (1, 1, 1), [view, (ArgKind.U32, 50)]), owner)  # holds the device 50 ms
    rt.flush()
    rt.release(buffer)
    assert rt.live_buffers == 1  # still in use by the GPU
    await rt.synchronize()
    assert rt.live_buffers == 0 and rt.memory_in_use == 0
    await rt.close()


async def test_saturation_clears_when_a_submission_completes() -> None:
    rt, _ = make(Settings(max_submissions_in_flight=2))
    owner = Owner()
    buffer = rt.alloc(64)
    program = await _program(rt, "spin")
    for _ in range(2):
        rt.dispatch(rt.prepare(program, (1, 1, 1), [buffer, (ArgKind.U32, 30)]), owner)
        rt.flush()
    assert rt.saturated
    assert rt.counters["worker_submits"] == 1  # the second went to the submit worker: the first was running
    await rt.unsaturated()
    assert not rt.saturated
    await rt.close()


async def test_a_refused_submission_fails_its_owners_and_the_device_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    rt, lost = make()
    device: Any = rt.device
    owner, bystander = Owner(), Owner()
    buffer = rt.alloc(256)
    program = await _program(rt, "scale")
    real_submit = device.submit
    monkeypatch.setattr(device, "submit", lambda commands: (_ for _ in ()).throw(ValueError("validation")))
    rt.dispatch(rt.prepare(program, (1, 1, 1), [buffer, buffer, (ArgKind.F32, 2.0)]), owner)
    failed = rt.synchronize()
    with pytest.raises(SubmissionFailed):
        await failed
    assert len(owner.lost) == 1 and isinstance(owner.lost[0], SubmissionFailed) and not bystander.lost
    monkeypatch.setattr(device, "submit", real_submit)
    rt.dispatch(rt.prepare(program, (1, 1, 1), [buffer, buffer, (ArgKind.F32, 2.0)]), bystander)
    await rt.synchronize()
    assert not lost and not bystander.lost and rt.ledger.lost is None
    await rt.close()


async def test_a_lost_device_is_reported_once_and_fails_new_work(monkeypatch: pytest.MonkeyPatch) -> None:
    rt, lost = make()
    device: Any = rt.device
    buffer = rt.alloc(256)
    monkeypatch.setattr(device, "submit", lambda commands: (_ for _ in ()).throw(DeviceLost("gone")))
    program = await _program(rt, "scale")
    rt.dispatch(rt.prepare(program, (1, 1, 1), [buffer, buffer, (ArgKind.F32, 2.0)]), Owner())
    with pytest.raises(DeviceLost):
        await rt.synchronize()
    assert len(lost) == 1
    with pytest.raises(DeviceLost):
        rt.alloc(16)
    await rt.close()


async def test_compiles_are_shared_and_run_off_the_loop() -> None:
    rt, _ = make()
    first = rt.program("fake:axpb", "axpb", KernelOptions())
    second = rt.program("fake:axpb", "axpb", KernelOptions())
    assert isinstance(first, asyncio.Future) and first is second  # one compile, whoever asks
    program = await first
    assert rt.program("fake:axpb", "axpb", KernelOptions()) is program
    await rt.close()


async def _program(rt: DeviceRuntime, name: str) -> Any:
    got = rt.program(f"fake:{name}", name, KernelOptions())
    return await got if isinstance(got, asyncio.Future) else got


async def test_while_another_device_has_work_a_device_submits_on_its_own_thread_and_never_polls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The loop thread serves every device: it submits inline and polls an awaited completion only while
    no other device has work, so that one device's launches and completion never hold up another's."""
    a, _ = make()
    b, _ = make()
    a.neighbours = b.neighbours = [a, b]
    owner = Owner()
    awaited: list[bool] = []
    watch = a.device.watch

    def watching(submitted: Any, done: Any, flag: bool) -> None:
        awaited.append(flag)
        watch(submitted, done, flag)

    monkeypatch.setattr(a.device, "watch", watching)
    spin_a, spin_b = await _program(a, "spin"), await _program(b, "spin")
    buffer_a, buffer_b = a.alloc(64), b.alloc(64)
    a.dispatch(a.prepare(spin_a, (1, 1, 1), [buffer_a, (ArgKind.U32, 1)]), owner)
    a.want_flush()
    a.flush()
    assert a.counters["worker_submits"] == 0 and awaited == [True]  # alone: inline, and it may poll
    await a.synchronize()
    b.dispatch(b.prepare(spin_b, (1, 1, 1), [buffer_b, (ArgKind.U32, 100)]), owner)
    b.flush()  # device 1 busy for 100 ms
    assert b.busy and not a.alone()
    a.dispatch(a.prepare(spin_a, (1, 1, 1), [buffer_a, (ArgKind.U32, 1)]), owner)
    a.want_flush()
    a.flush()
    assert a.counters["worker_submits"] == 1  # on device 0's submit worker
    await a.synchronize()
    assert awaited == [True, False]  # and its completion went to the completion path, unpolled
    assert b.busy  # device 0 finished while device 1 still runs
    await b.synchronize()
    assert a.alone() and b.alone() and not a.busy
    await a.close()
    await b.close()

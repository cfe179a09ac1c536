"""Every submission starts at the flush policy, and nothing that completes inside a submit is handled
there: its callbacks (a readback's reply) run once the loop runs again, never inside the flush's call
stack (service -> runtime -> backend -> runtime -> session -> service)."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from gpud.backends.fake import FakeDevice, _Submission
from gpud.runtime.runtime import DeviceRuntime
from runtime.test_runtime import Owner, Settings, drive


class InlineDevice(FakeDevice):
    """A device that has finished a submission by the time `submit` returns, and reports it at once
    from `watch` (as the cuda backend does when it polls a submission a readback awaits). It records
    whether each submission was started by the flush policy."""

    runtime: DeviceRuntime | None = None

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(0, loop, 64 << 20)
        self.through_policy: list[bool] = []

    def take_commands(self) -> list[tuple[Any, ...]]:
        assert self.runtime is not None
        self.through_policy.append(self.runtime.policy.flushing)  # on the loop thread, as the submit starts
        return super().take_commands()

    def submit(self, commands: Any) -> _Submission:
        for command in commands:
            if command[0] == "copy":
                _, src, src_offset, dst, dst_offset, nbytes = command
                dst[dst_offset : dst_offset + nbytes] = src[src_offset : src_offset + nbytes]
        submission = _Submission()
        submission.finish()
        return submission


def inline_runtime(settings: Settings | None = None) -> DeviceRuntime:
    device = InlineDevice(asyncio.get_running_loop())
    rt = DeviceRuntime(device, settings or Settings(), lambda _rt, error: None)
    device.runtime = rt
    return rt


async def test_a_completion_reported_inside_a_flush_is_handled_after_it() -> None:
    """Regression: the readback's data was delivered from inside `after_drain`'s flush."""
    rt = inline_runtime()
    owner = Owner()
    events: list[str] = []
    buffer = rt.alloc(16)
    await drive(rt.upload(buffer, memoryview(np.arange(4, dtype=np.float32).tobytes()), owner))
    await drive(rt.download(buffer, lambda part, data, error: events.append("delivered"), owner))
    events.append("flush starts")
    rt.after_drain()  # the router's end of a drain: the policy flushes what a readback awaits
    events.append("flush returned")
    for _ in range(3):
        await asyncio.sleep(0)
    assert events == ["flush starts", "flush returned", "delivered"]
    await rt.close()


async def test_every_submission_comes_through_the_flush_policy() -> None:
    """Regression: a staging pool that ran dry, `synchronize` and `flush` submitted around the policy."""
    rt = inline_runtime(Settings(staging_pool_bytes=64 << 10))
    device: Any = rt.device
    owner = Owner()
    buffer = rt.alloc(1 << 20)
    await drive(rt.upload(buffer, memoryview(bytes(1 << 20)), owner))  # many chunks: the pool runs dry
    await rt.synchronize()
    rt.upload(buffer, memoryview(bytes(16)), owner)
    rt.flush()
    await rt.synchronize()
    assert len(device.through_policy) >= 3 and all(device.through_policy), device.through_policy
    await rt.close()

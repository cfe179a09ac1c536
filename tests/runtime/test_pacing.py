"""Long work goes to the device in pieces the health check sees complete (gpud.runtime.pacing), on
the fake backend with a virtual clock: no GPU, no daemon, no timing."""

from __future__ import annotations

import asyncio
from collections import deque
from types import SimpleNamespace
from typing import Any

import pytest

from gpud.backends.base import DispatchStep, Var
from gpud.backends.fake import FakeDevice, _Submission
from gpud.runtime import ledger as ledger_module
from gpud.runtime import pacing as pacing_module
from gpud.runtime.pacing import SOFTWARE_START, Pacer
from gpud.runtime.runtime import DeviceRuntime
from gpud.service.health import assess
from gpud_protocol import ArgKind, KernelOptions
from runtime.test_runtime import Owner, Settings

STALL_S = 30.0


class HeldDevice(FakeDevice):
    """A software fake device that counts its submissions and runs each only when the test says."""

    software = True

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(0, loop, 64 << 20)
        self.held: deque[tuple[Any, _Submission]] = deque()
        self.dispatches: list[int] = []  # per submission, in order

    def submit(self, commands: Any) -> _Submission:
        submission = _Submission()
        self.held.append((commands, submission))
        self.dispatches.append(sum(1 for command in commands if command[0] == "dispatch"))
        return submission

    def run_next(self) -> None:
        self._queue.put(self.held.popleft())  # the device thread runs it and reports its completion


class Clock:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now = 1000.0
        fake = SimpleNamespace(monotonic=lambda: self.now)
        monkeypatch.setattr(ledger_module, "time", fake)
        monkeypatch.setattr(pacing_module, "time", fake)


async def runtime() -> tuple[DeviceRuntime, HeldDevice, Any]:
    device = HeldDevice(asyncio.get_running_loop())
    rt = DeviceRuntime(device, Settings(), lambda _rt, _error: None)
    got = rt.program("fake:scale", "scale", KernelOptions())
    program = await got if isinstance(got, asyncio.Future) else got
    return rt, device, program


async def submitted(rt: DeviceRuntime) -> None:
    """Until every flush has reached the device (later submits go through the submit worker)."""
    while not rt.submitter.idle:
        await asyncio.sleep(0.001)


async def complete_next(rt: DeviceRuntime, device: HeldDevice) -> None:
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    rt.ledger.after(rt.ledger.completed + 1, lambda _error: done.set_result(None))
    device.run_next()
    await done


async def test_a_long_batch_is_several_submissions_and_health_stays_true_while_they_complete(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Regression: on lavapipe one coalesced batch of a model (34 s) was one submission, reported
    unhealthy ("pending and none completed for 30.6 s") six times while it progressed."""
    clock = Clock(monkeypatch)
    rt, device, program = await runtime()
    owner = Owner()
    x, y = rt.alloc(256), rt.alloc(256)
    prepared = rt.prepare(program, (1, 1, 1), [x, y, (ArgKind.F32, 2.0)])
    for _ in range(5):
        rt.dispatch(prepared, owner)
    rt.flush()
    await submitted(rt)
    assert SOFTWARE_START == 1 and device.dispatches == [1] * 5  # nothing measured yet: one at a time

    for _ in range(5):  # each piece takes 20 s: 100 s of work, never 30 s without a completion
        clock.now += 20.0
        assert assess([rt], STALL_S, clock.now).healthy
        await complete_next(rt, device)
    assert rt.ledger.in_flight == 0 and assess([rt], STALL_S, clock.now + 1000).healthy
    assert rt.policy.max_dispatches == 1  # 20 s a dispatch, against submission_target_s = 1 s

    # A hang is still a hang.
    rt.dispatch(prepared, owner)
    rt.flush()
    await submitted(rt)
    clock.now += STALL_S + 1
    health = assess([rt], STALL_S, clock.now)
    assert not health.healthy
    assert health.problems[0].startswith("device 0: 1 submission(s) pending and none completed for 31.0 s")
    await complete_next(rt, device)
    await rt.close()


async def test_a_long_replay_is_submitted_in_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    """One graph is many dispatches: on a software device its replay is cut like coalesced work."""
    clock = Clock(monkeypatch)
    rt, device, program = await runtime()
    x, y = rt.alloc(256), rt.alloc(256)
    rt.dispatch(rt.prepare(program, (1, 1, 1), [x, y, (ArgKind.F32, 2.0)]), Owner())
    rt.flush()
    await submitted(rt)
    clock.now += 0.125
    await complete_next(rt, device)
    assert rt.policy.max_dispatches == 2  # a full submission that ran quickly: twice as many next

    steps = [DispatchStep(program, (1, 1, 1), (x, y, Var(0, ArgKind.F32)))] * 5
    replayable = rt.instantiate(steps)
    rt.replay(replayable, [2.0], Owner())
    rt.flush()
    await submitted(rt)
    assert device.dispatches == [1, 2, 2, 1]  # not one submission of 5
    assert x.last_use == y.last_use == 4  # its buffers live until the last piece completed
    for _ in range(3):
        await complete_next(rt, device)
    await rt.close()


def test_the_pacer_cuts_long_submissions_and_grows_back_while_they_run_fast() -> None:
    now = [0.0]
    pacer = Pacer(1024, 1.0, software=True, clock=lambda: now[0])
    assert pacer.bound == SOFTWARE_START == 1  # nothing measured on a software device yet

    def run(index: int, dispatches: int, seconds: float) -> int:
        pacer.submitted(index, dispatches)
        now[0] += seconds
        pacer.completed(index)
        return pacer.bound

    assert run(1, 1, 0.01) == 2  # full and fast: twice as many
    assert run(2, 0, 5.0) == 2  # copies only: teaches nothing
    assert run(3, 2, 0.01) == 4
    assert run(4, 1, 0.01) == 4  # not full: no reason to grow
    assert run(5, 4, 0.8) == 4  # full, and close to the target: as it is
    assert run(6, 4, 8.0) == 1  # 2 s a dispatch: one at a time
    assert run(7, 1, 0.6) == 1  # slow noise of a short submission changes nothing either way
    bounds = [run(index, pacer.bound, 0.001) for index in range(8, 20)]
    assert bounds[:3] == [2, 4, 8] and bounds[-1] == 1024  # fast work: the whole ceiling again
    now[0] = 100.0
    assert run(20, 1024, 4.0) == 256  # a long one cuts the bound to what takes about 1 s
    gpu = Pacer(1024, 1.0, software=False)
    assert gpu.bound == 1024  # a GPU starts at the ceiling
    unpaced = Pacer(1024, 0.0, software=True)
    unpaced.submitted(1, 1024)
    unpaced.completed(1)
    assert unpaced.bound == 1024  # 0: by count alone

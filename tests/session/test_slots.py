"""Slot graphs (gpud.session.slots): a row-independent graph whose state has a row per slot; each
session keeps its own slot, its row always at that row of the launch, merged with the others'."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator
from typing import Any

import numpy as np
import pytest
from support import Daemon, stopped, until_together

import gpud_client
from gpud.testing import spawn
from gpud_client import InvalidArgument, u32
from gpud_protocol import ArgKind

W = 64  # floats per row
SEND_S = 1.0  # while the daemon is stopped: long enough for every client to have sent, on a busy machine
P = 4  # slots


@pytest.fixture(scope="module")
def fake() -> Iterator[Daemon]:
    with spawn.daemon("fake", extra_args=("--lease", "5")) as (address, proc):
        yield Daemon(address, proc, "fake")
        assert proc.poll() is None


async def build_accumulator(gpu: gpud_client.Client, name: str, feed: bool = False) -> None:
    """out = state + x; state <- out: each slot sums the inputs of its session. Built for 1, 2 and 4 rows;
    with `feed`, out feeds x in a multi-step replay."""
    add = await gpu.kernel("fake:add", "add")
    total = gpu.empty((P, W), "float32")
    step = None
    for rows in (1, 2, 4):
        g = gpu.graph(name, slots=P)
        x = g.input("x", (rows, W), "float32")
        state = g.state(total, rows)
        out = g.empty((rows, W), "float32")
        g.dispatch(add, rows, [state, x, out, u32(rows * W)])
        g.copy(out, state)
        g.output("out", out)
        if feed:
            g.feed("out", into="x")
        step = await g.build()
    assert step is not None
    gpu.publish_graph(step, name)
    total.free()  # the graph holds it
    await gpu.sync()


@contextlib.asynccontextmanager
async def sessions(address: str, count: int, name: str) -> AsyncIterator[list[tuple[gpud_client.Client, Any]]]:
    async with contextlib.AsyncExitStack() as stack:
        out = []
        for _ in range(count):
            gpu = await stack.enter_async_context(gpud_client.connect(address))
            out.append((gpu, await gpu.open_graph(name)))
        yield out


async def counters(gpu: gpud_client.Client) -> dict[str, int]:
    device = (await gpu.stats())["device"]
    return {k: int(device.get(k, 0)) for k in ("merged_launches", "row_launches")}


async def together(daemon: Daemon, calls: list[Any]) -> list[Any]:
    with stopped(daemon):
        tasks = [asyncio.create_task(call) for call in calls]
        await asyncio.sleep(SEND_S)
    return await asyncio.wait_for(asyncio.gather(*tasks), 20)


async def test_each_session_keeps_its_own_slot_through_merged_launches(fake: Daemon) -> None:
    async with gpud_client.connect(fake.address) as builder:
        await build_accumulator(builder, "acc")
        xs = [np.full((1, W), i + 1, np.float32) for i in range(3)]
        async with sessions(fake.address, 3, "acc") as open_:
            rounds = 0

            async def round_() -> bool:  # the first may zero slots: the second is the one counted
                nonlocal rounds
                rounds += 1
                before = await counters(builder)
                outs = await together(fake, [step.replay(x=x) for (_gpu, step), x in zip(open_, xs, strict=True)])
                after = await counters(builder)
                for out, x in zip(outs, xs, strict=True):
                    np.testing.assert_array_equal(out["out"], x * rounds)  # its own sum, nobody else's
                return rounds > 1 and after["merged_launches"] - before["merged_launches"] == 1

            await until_together(round_, "three slots in one launch")
            (_gpu, alone), x = open_[1], xs[1]
            np.testing.assert_array_equal((await alone.replay(x=x))["out"], x * (rounds + 1))  # alone: its slot still
        async with sessions(fake.address, 1, "acc") as [(_gpu, newcomer)]:
            y = np.full((1, W), 10, np.float32)
            np.testing.assert_array_equal((await newcomer.replay(x=y))["out"], y)  # a freed slot, zeroed
        builder.unpublish_graph("acc")


async def private_bytes(gpu: gpud_client.Client) -> int:
    return int((await gpu.stats())["session"]["private_bytes"])


def accumulate(state: np.ndarray, x: np.ndarray, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """The accumulator's outputs over `steps` steps with out fed into x, and the state after them."""
    outs = []
    for _ in range(steps):
        state = state + x
        x = state
        outs.append(state)
    return np.stack(outs), state


async def test_multi_step_replays_merge_and_each_keeps_its_own_slot(fake: Daemon) -> None:
    """Three sessions' replays of 3 steps each (out fed forward on the device) in one launch: each gets
    its own rows of every step, as its slot alone gives them; a session alone at a slot past the first
    steps its own slot and no other."""
    async with gpud_client.connect(fake.address) as builder:
        await build_accumulator(builder, "acc-steps", feed=True)
        xs = [np.full((1, W), i + 1, np.float32) for i in range(3)]
        async with sessions(fake.address, 3, "acc-steps") as open_:
            states = [np.zeros((1, W), np.float32) for _ in xs]
            for i, ((_gpu, step), x) in enumerate(zip(open_, xs, strict=True)):
                np.testing.assert_array_equal((await step.replay(x=x))["out"], x)  # each takes its slot
                states[i] = x.copy()
            held = [await private_bytes(gpu) for gpu, _step in open_]

            async def round_() -> bool:
                before = await counters(builder)
                calls = [step.replay_steps(3, x=x) for (_gpu, step), x in zip(open_, xs, strict=True)]
                outs = await together(fake, calls)
                after = await counters(builder)
                for i, (out, x) in enumerate(zip(outs, xs, strict=True)):
                    want, states[i] = accumulate(states[i], x, 3)
                    np.testing.assert_array_equal(out["out"], want)  # (3, 1, W): its own slot's sums
                return after["merged_launches"] - before["merged_launches"] == 1

            await until_together(round_, "three multi-step replays in one launch")
            for (gpu, _step), before in zip(open_, held, strict=True):  # each one's share of the scratch, back
                await gpu.sync()
                assert await private_bytes(gpu) == before
            (_gpu, second), x = open_[1], xs[1]
            want, states[1] = accumulate(states[1], x, 2)
            np.testing.assert_array_equal((await second.replay_steps(2, x=x))["out"], want)  # alone, at its slot
            for i in (0, 2):  # the others' slots untouched by it
                (_gpu, step), x = open_[i], xs[i]
                want, states[i] = accumulate(states[i], x, 1)
                np.testing.assert_array_equal((await step.replay(x=x))["out"], want[0])
        builder.unpublish_graph("acc-steps")


async def test_slots_run_out_and_come_back(fake: Daemon) -> None:
    async with gpud_client.connect(fake.address) as builder:
        await build_accumulator(builder, "acc-full")
        x = np.ones((1, W), np.float32)
        async with sessions(fake.address, P, "acc-full") as open_:
            for _gpu, step in open_:
                await step.replay(x=x)
            async with sessions(fake.address, 1, "acc-full") as [(_gpu, late)]:
                with pytest.raises(gpud_client.Busy, match="slots are taken"):
                    await late.replay(x=x)
                open_[0][1].free()  # its last handle: the slot is free
                await open_[0][0].sync()
                np.testing.assert_array_equal((await late.replay(x=x))["out"], x)
        builder.unpublish_graph("acc-full")


async def test_a_slot_graph_is_replayed_a_row_at_a_time_and_checked_at_build(fake: Daemon) -> None:
    async with gpud_client.connect(fake.address) as gpu:
        await build_accumulator(gpu, "acc-rows")
        step = await gpu.open_graph("acc-rows")
        with pytest.raises(InvalidArgument, match="one row"):
            await step.replay(x=np.ones((2, W), np.float32))
        add = await gpu.kernel("fake:add", "add")
        wrong = gpu.empty((P + 1, W), "float32")
        g = gpu.graph("acc-wrong", slots=P)
        with pytest.raises(InvalidArgument, match="state of 4 rows"):
            g.state(wrong, 1)
        g = gpu.graph("acc-pad", slots=P)
        x = g.input("x", (1, W), "int32", pad=2**40)
        state = g.state(gpu.empty((P, W), "int32"), 1)
        out = g.empty((1, W), "int32")
        g.dispatch(add, 1, [state, x, out, u32(W)])
        g.output("out", out)
        with pytest.raises(InvalidArgument, match="cannot pad"):
            await g.build()
        gpu.unpublish_graph("acc-rows")
        await gpu.sync()


async def test_state_is_a_tensor_the_builder_may_write(fake: Daemon) -> None:
    async with gpud_client.connect(fake.address) as owner:
        weights = owner.tensor(np.ones((P, W), np.float32))
        owner.publish(weights, "slot-weights", mode="ro")
        await owner.sync()
        async with gpud_client.connect(fake.address) as gpu:
            add = await gpu.kernel("fake:add", "add")
            opened = await gpu.open("slot-weights")
            g = gpu.graph("acc-ro", slots=P)
            x = g.input("x", (1, W), "float32")
            state = g.state(opened, 1)
            out = g.empty((1, W), "float32")
            g.dispatch(add, 1, [state, x, out, u32(W)])  # reads it only; zeroing a slot would write it
            g.output("out", out)
            with pytest.raises(gpud_client.PermissionDenied, match="read-only resident"):
                await g.build()
        owner.unpublish("slot-weights")
        weights.free()
        await owner.sync()


async def test_a_state_handle_that_is_not_the_sessions_is_refused(fake: Daemon) -> None:
    async with gpud_client.connect(fake.address) as other, gpud_client.connect(fake.address) as gpu:
        theirs = other.empty((P, W), "float32")
        await other.sync()
        add = await gpu.kernel("fake:add", "add")
        for handle in (theirs.handle, 10**9):
            g = gpu.graph("acc-foreign", slots=P)
            x = g.input("x", (1, W), "float32")
            out = g.empty((1, W), "float32")
            g.dispatch(add, 1, [x, x, out, u32(W)])
            g.output("out", out)
            g._state.append((int(ArgKind.TENSOR), handle))  # only in the state list
            with pytest.raises(gpud_client.NotFound):
                await g.build()
        await gpu.sync()
    fake.assert_alive()


_HOLDER = textwrap.dedent(
    """
    import asyncio, sys
    import numpy as np
    import gpud_client

    async def main(address, steps):
        async with gpud_client.connect(address) as gpu:
            step = await gpu.open_graph("acc-killed")
            x = np.full((1, 64), 100, np.float32)
            await step.replay(x=x)
            print("ready", flush=True)
            while True:
                await (step.replay(x=x) if steps == 1 else step.replay_steps(steps, x=x))

    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
    """
)


@pytest.mark.parametrize("steps", [1, 4])
async def test_a_session_killed_while_stepping_frees_its_slot_and_the_others_go_on(steps: int) -> None:
    """A session killed mid-stream (replays, or windows of 4 steps): the others' merged launches go on,
    each with its own sums, and its slot comes back zeroed."""
    with spawn.daemon("fake", extra_args=("--lease", "1")) as (address, proc):
        async with gpud_client.connect(address) as builder:
            await build_accumulator(builder, "acc-killed", feed=True)
            async with sessions(address, 2, "acc-killed") as open_:
                states = []
                for (_gpu, step), value in zip(open_, (1, 2), strict=True):  # slots 0 and 1
                    x = np.full((1, W), value, np.float32)
                    await step.replay(x=x)
                    states.append(x)
                victim = await asyncio.create_subprocess_exec(
                    sys.executable, "-c", _HOLDER, address, str(steps), stdout=asyncio.subprocess.PIPE
                )
                try:
                    assert victim.stdout is not None
                    line = await asyncio.wait_for(victim.stdout.readline(), 30)
                    assert line.strip() == b"ready", line
                    victim.send_signal(signal.SIGKILL)  # slot 2, mid-stream
                    await victim.wait()
                finally:
                    if victim.returncode is None:
                        victim.kill()
                        await victim.wait()
                for _round in range(4):  # while the daemon notices, and after: the others step on, merged
                    xs = [np.full((1, W), v, np.float32) for v in (1, 2)]
                    calls = [
                        step.replay(x=x) if steps == 1 else step.replay_steps(steps, x=x)
                        for (_gpu, step), x in zip(open_, xs, strict=True)
                    ]
                    outs = await asyncio.gather(*calls)
                    for i, (out, x) in enumerate(zip(outs, xs, strict=True)):
                        want, states[i] = accumulate(states[i], x, steps)
                        np.testing.assert_array_equal(out["out"], want[0] if steps == 1 else want)
                    await asyncio.sleep(0.5)
                async with sessions(address, 1, "acc-killed") as [(_gpu, newcomer)]:  # the freed slot, zeroed
                    out = await newcomer.replay(x=np.full((1, W), 7, np.float32))
                    np.testing.assert_array_equal(out["out"], np.full((1, W), 7, np.float32))
            builder.unpublish_graph("acc-killed")
        assert proc.poll() is None

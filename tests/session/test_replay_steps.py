"""Multi-step replays (`ReplaySteps`, `Step.replay_steps`): n replays in one message, an output fed into
the next step's input on the device, every step's outputs in one reply; their scratch memory charged
while they run and given back after."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from support import Daemon

import gpud_client
from gpud.testing import spawn
from gpud_client import InvalidArgument, OutOfMemory, u32

N = 64
CARRY = 256  # the fed output kept for a chained replay: 64 floats, on 256 bytes


@pytest.fixture(scope="module")
def fake() -> Iterator[Daemon]:
    with spawn.daemon("fake", extra_args=("--session-memory-bytes", str(256 << 10))) as (address, proc):
        yield Daemon(address, proc, "fake")
        assert proc.poll() is None


async def chain(gpu: gpud_client.Client, name: str, feed: bool = True) -> gpud_client.Step:
    """y = 0.5 x + b over 64 floats, b a scalar; y feeds x."""
    k = await gpu.kernel("fake:axpb", "axpb")
    g = gpu.graph(name)
    x = g.input("x", (N,), "float32")
    b = g.scalar("b", "f32")
    y = g.empty((N,), "float32")
    g.dispatch(k, 1, [x, y, 0.5, b, u32(N)])
    g.output("y", y)
    if feed:
        g.feed("y", into="x")
    return await g.build()


def recurrence(x: np.ndarray, b: float, steps: int) -> np.ndarray:
    out = []
    for _ in range(steps):
        x = (x * np.float32(0.5) + np.float32(b)).astype(np.float32)
        out.append(x)
    return np.stack(out)


async def private_bytes(gpu: gpud_client.Client) -> int:
    return int((await gpu.stats())["session"]["private_bytes"])


async def test_steps_feed_their_output_forward_and_equal_single_replays(fake: Daemon) -> None:
    async with gpud_client.connect(fake.address) as gpu:
        step = await chain(gpu, "chain")
        x0 = np.arange(N, dtype=np.float32)
        baseline = await private_bytes(gpu)
        for steps in (1, 2, 7, 40):
            out = await step.replay_steps(steps, x=x0, b=1.0)
            assert out["y"].shape == (steps, N)
            np.testing.assert_array_equal(out["y"], recurrence(x0, 1.0, steps))
        x, singles = x0, []
        for _ in range(7):
            x = (await step.replay(x=x, b=1.0))["y"]
            singles.append(x)
        np.testing.assert_array_equal(np.stack(singles), recurrence(x0, 1.0, 7))
        await gpu.sync()
        assert await private_bytes(gpu) == baseline + CARRY  # the scratch went back; the carry stays


async def test_without_feeds_each_step_takes_its_own_inputs(fake: Daemon) -> None:
    async with gpud_client.connect(fake.address) as gpu:
        step = await chain(gpu, "independent", feed=False)
        xs = np.random.default_rng(0).standard_normal((5, N)).astype(np.float32)
        out = await step.replay_steps(5, x=xs, b=2.0)
        np.testing.assert_array_equal(out["y"], (xs * np.float32(0.5) + np.float32(2.0)).astype(np.float32))
        with pytest.raises(InvalidArgument, match="one value per step"):
            await step.replay_steps(4, x=xs, b=2.0)


async def test_bad_steps_and_feeds_are_refused(fake: Daemon) -> None:
    async with gpud_client.connect(fake.address) as gpu:
        step = await chain(gpu, "refusals")
        x0 = np.zeros(N, np.float32)
        for steps in (0, -1, gpu.limits.max_replay_steps + 1, 2.0):
            with pytest.raises(InvalidArgument, match="steps is an int"):
                await step.replay_steps(steps, x=x0, b=1.0)  # type: ignore[arg-type]
        with pytest.raises(OutOfMemory, match="session quota"):  # 1,000 steps of 512 bytes: past 256 KiB
            await step.replay_steps(1000, x=x0, b=1.0)
        np.testing.assert_array_equal((await step.replay_steps(2, x=x0, b=1.0))["y"], recurrence(x0, 1.0, 2))
        k = await gpu.kernel("fake:axpb", "axpb")
        g = gpu.graph("mismatched")
        x = g.input("x", (N,), "float32")
        y = g.empty((N // 2,), "float32")
        g.dispatch(k, 1, [x, y, 0.5, 1.0, u32(N // 2)])
        g.output("y", y)
        g.feed("y", into="x")
        with pytest.raises(InvalidArgument, match="one dtype and as many elements"):
            await g.build()
        g = gpu.graph("unknown-feed")
        x = g.input("x", (N,), "float32")
        g.output("x", x)
        g.feed("nothing", into="x")
        with pytest.raises(InvalidArgument, match="an output of the graph into one of its inputs"):
            await g.build()


async def test_a_published_graph_runs_steps_for_another_session(fake: Daemon) -> None:
    async with gpud_client.connect(fake.address) as builder:
        step = await chain(builder, "shared-chain")
        builder.publish_graph(step, "shared-chain")
        await builder.sync()
        async with gpud_client.connect(fake.address) as other:
            opened = await other.open_graph("shared-chain")
            assert opened.feeds == {"y": "x"}
            x0 = np.ones(N, np.float32)
            np.testing.assert_array_equal((await opened.replay_steps(3, x=x0, b=0.0))["y"], recurrence(x0, 0.0, 3))
        builder.unpublish_graph("shared-chain")


async def test_chained_windows_continue_on_the_device(fake: Daemon) -> None:
    """A window sent with chain=True starts from the last step of the window before, on the device:
    awaited one after the other, or both sent before either answered."""
    async with gpud_client.connect(fake.address) as gpu:
        step = await chain(gpu, "chained")
        x0 = np.arange(N, dtype=np.float32)
        want = recurrence(x0, 1.0, 15)
        first = await step.replay_steps(5, x=x0, b=1.0)
        second = await step.replay_steps(3, chain=True, b=1.0)
        np.testing.assert_array_equal(np.concatenate([first["y"], second["y"]]), want[:8])
        sent = [step.replay_steps(4, x=x0, b=1.0), step.replay_steps(6, chain=True, b=1.0)]
        third = step.replay_steps(5, chain=True, b=1.0)
        outs = [await s for s in (*sent, third)]
        np.testing.assert_array_equal(np.concatenate([o["y"] for o in outs]), want)


async def test_each_session_chains_from_its_own_last_window(fake: Daemon) -> None:
    """Two sessions replaying one published graph, their windows interleaved: each chain continues the
    session's own sequence; a session's carry is charged to it until it frees the graph."""
    async with gpud_client.connect(fake.address) as builder:
        builder.publish_graph(await chain(builder, "chain-two"), "chain-two")
        await builder.sync()
        async with gpud_client.connect(fake.address) as a, gpud_client.connect(fake.address) as b:
            steps = [await a.open_graph("chain-two"), await b.open_graph("chain-two")]
            before = [await private_bytes(a), await private_bytes(b)]
            starts = [np.zeros(N, np.float32), np.full(N, 100.0, np.float32)]
            outs: list[list[np.ndarray]] = [[], []]
            for i, s in enumerate(steps):
                outs[i].append((await s.replay_steps(2, x=starts[i], b=float(i)))["y"])
            for _ in range(2):
                for i, s in enumerate(steps):
                    outs[i].append((await s.replay_steps(3, chain=True, b=float(i)))["y"])
            for i in range(2):
                np.testing.assert_array_equal(np.concatenate(outs[i]), recurrence(starts[i], float(i), 8))
            assert [await private_bytes(a), await private_bytes(b)] == [v + CARRY for v in before]
            steps[0].free()
            await a.sync()
            assert await private_bytes(a) == before[0]
            reopened = await a.open_graph("chain-two")
            reopened._fed_like = {"x": np.zeros(N, np.float32)}  # past the client's own check: the daemon's
            with pytest.raises(InvalidArgument, match="there is none"):
                await reopened.replay_steps(2, chain=True, b=0.0)
        builder.unpublish_graph("chain-two")


async def test_chains_that_cannot_be_are_refused(fake: Daemon) -> None:
    async with gpud_client.connect(fake.address) as gpu:
        step = await chain(gpu, "chain-refusals")
        x0 = np.zeros(N, np.float32)
        with pytest.raises(InvalidArgument, match="continues an earlier replay_steps"):
            await step.replay_steps(2, chain=True, b=1.0)
        await step.replay_steps(2, x=x0, b=1.0)
        with pytest.raises(InvalidArgument, match="come from the device"):
            await step.replay_steps(2, chain=True, x=x0, b=1.0)
        unfed = await chain(gpu, "chain-unfed", feed=False)
        with pytest.raises(InvalidArgument, match="continues an earlier replay_steps"):
            await unfed.replay_steps(2, chain=True, b=1.0)
        unfed.feeds, unfed._fed_like = {"y": "x"}, {"x": x0}  # past the client's own check: the daemon's
        with pytest.raises(InvalidArgument, match="feeds no input"):
            await unfed.replay_steps(2, chain=True, b=1.0)
        k = await gpu.kernel("fake:axpb", "axpb")
        g = gpu.graph("chain-rows", rows=True)  # merged with other sessions' rows: nothing to chain from
        x = g.input("x", (1, N), "float32")
        y = g.empty((1, N), "float32")
        g.dispatch(k, 1, [x, y, 0.5, 1.0, u32(N)])
        g.output("y", y)
        g.feed("y", into="x")
        rows = await g.build()
        await rows.replay_steps(2, x=x0[None])
        with pytest.raises(InvalidArgument, match="merges its replays"):
            await rows.replay_steps(2, chain=True)

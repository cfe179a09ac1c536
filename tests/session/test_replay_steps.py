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
        assert await private_bytes(gpu) == baseline  # the scratch went back


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


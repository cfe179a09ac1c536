"""Merged replays of row-independent graphs (gpud.session.merging): the replays several sessions send
at once run as one launch of the smallest instance holding their rows, and each session gets exactly
the result it would have got alone.

To make replays arrive in one slice, the daemon is stopped (SIGSTOP) while the clients send, then
continued: it reads them all at once, most of the time (`support.stopped`: a split slice sends again).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
from collections.abc import AsyncIterator, Iterator
from typing import Any

import numpy as np
import pytest
from support import Daemon, stopped, until_together

import gpud_client
import gpud_protocol as proto
from gpud.testing import spawn
from gpud_client import InvalidArgument, nn

WIDTH = 64  # the fake `scale` kernel scales whole groups of 64
SEND_S = 1.0  # while the daemon is stopped: long enough for every client to have sent, on a busy machine
SIZES = (1, 2, 4, 8)


@pytest.fixture(scope="module")
def fake() -> Iterator[Daemon]:
    with spawn.daemon("fake", extra_args=("--lease", "5")) as (address, proc):
        yield Daemon(address, proc, "fake")
        assert proc.poll() is None


async def build_scale(gpu: gpud_client.Client, name: str) -> None:
    """y = a * x over rows of 64, built for 1, 2, 4 and 8 rows, published as `name`."""
    k = await gpu.kernel("fake:scale", "scale")
    step = None
    for rows in SIZES:
        g = gpu.graph(name, rows=True)
        x = g.input("x", (rows, WIDTH), "float32")
        a = g.scalar("a", "f32")
        y = g.empty((rows, WIDTH), "float32")
        g.dispatch(k, rows, [x, y, a])
        g.output("y", y)
        step = await g.build()
    assert step is not None
    gpu.publish_graph(step, name)
    await gpu.sync()


@contextlib.asynccontextmanager
async def clients(address: str, count: int) -> AsyncIterator[list[gpud_client.Client]]:
    async with contextlib.AsyncExitStack() as stack:
        yield [await stack.enter_async_context(gpud_client.connect(address)) for _ in range(count)]


async def device_counters(gpu: gpud_client.Client) -> dict[str, int]:
    device = (await gpu.stats())["device"]
    return {k: int(device.get(k, 0)) for k in ("merged_launches", "merged_rows", "row_launches")}


async def replay_together(
    daemon: Daemon, steps: list[Any], inputs: list[dict[str, Any]]
) -> list[dict[str, np.ndarray[Any, Any]]]:
    """Each step's replay sent while the daemon is stopped, so that it reads them in one slice."""
    with stopped(daemon):
        tasks = [asyncio.create_task(step.replay(**values)) for step, values in zip(steps, inputs, strict=True)]
        await asyncio.sleep(SEND_S)  # every replay is in the socket
    return await asyncio.wait_for(asyncio.gather(*tasks), 20)


async def test_replays_sent_together_run_as_one_launch_with_each_rows_back(fake: Daemon) -> None:
    async with gpud_client.connect(fake.address) as builder:
        await build_scale(builder, "merge-scale")
        rows = [1, 2, 1, 4]  # 8 rows: one launch of the 8-row instance
        rng = np.random.default_rng(0)
        inputs: list[dict[str, Any]] = [{"x": rng.standard_normal((r, WIDTH), np.float32), "a": 2.5} for r in rows]
        async with clients(fake.address, len(rows)) as gpus:
            steps = [await gpu.open_graph("merge-scale") for gpu in gpus]

            async def round_() -> bool:
                before = await device_counters(builder)
                outs = await replay_together(fake, steps, inputs)
                after = await device_counters(builder)
                for out, values in zip(outs, inputs, strict=True):
                    np.testing.assert_array_equal(out["y"], values["x"] * np.float32(2.5))  # bit for bit
                solo = await steps[0].replay(**inputs[1])  # alone, afterwards: the same bits
                np.testing.assert_array_equal(solo["y"], outs[1]["y"])
                launches, merged = (after[k] - before[k] for k in ("merged_launches", "merged_rows"))
                return (launches, merged) == (1, 8)

            await until_together(round_, "four replays in one launch of 8 rows")
        builder.unpublish_graph("merge-scale")


async def test_multi_step_replays_of_as_many_steps_merge_and_others_go_alone(fake: Daemon) -> None:
    """Replays of 3 steps (y fed into x: x * a^k) from three sessions in one launch, each getting its own
    rows of every step; a replay of another step count beside them is a launch of its own."""
    async with gpud_client.connect(fake.address) as builder:
        k = await builder.kernel("fake:scale", "scale")
        step = None
        for size in SIZES:
            g = builder.graph("merge-steps", rows=True)
            x = g.input("x", (size, WIDTH), "float32")
            y = g.empty((size, WIDTH), "float32")
            g.dispatch(k, size, [x, y, 2.0])
            g.output("y", y)
            g.feed("y", into="x")
            step = await g.build()
        assert step is not None
        builder.publish_graph(step, "merge-steps")
        await builder.sync()
        rows, counts = [1, 2, 1, 2], [3, 3, 3, 2]
        rng = np.random.default_rng(1)
        xs = [rng.standard_normal((r, WIDTH)).astype(np.float32) for r in rows]
        async with clients(fake.address, len(rows)) as gpus:
            steps = [await gpu.open_graph("merge-steps") for gpu in gpus]

            async def round_() -> bool:
                before = await device_counters(builder)
                with stopped(fake):
                    calls = [s.replay_steps(n, x=x) for s, n, x in zip(steps, counts, xs, strict=True)]
                    tasks = [asyncio.create_task(call) for call in calls]
                    await asyncio.sleep(SEND_S)
                outs = await asyncio.wait_for(asyncio.gather(*tasks), 20)
                after = await device_counters(builder)
                for out, n, x in zip(outs, counts, xs, strict=True):
                    want = np.stack([x * np.float32(2.0**j) for j in range(1, n + 1)])
                    np.testing.assert_array_equal(out["y"], want)  # (n, rows, WIDTH), its own rows
                launches, merged = (after[k] - before[k] for k in ("merged_launches", "merged_rows"))
                return (launches, merged, after["row_launches"] - before["row_launches"]) == (1, 4, 1)

            await until_together(round_, "three multi-step replays in one launch, the fourth alone")
        builder.unpublish_graph("merge-steps")


async def test_groups_by_scalars_and_split_past_the_largest_instance(fake: Daemon) -> None:
    async with gpud_client.connect(fake.address) as builder:
        await build_scale(builder, "merge-groups")
        plan = [(4, 1.0), (4, 1.0), (2, 1.0), (1, 3.0), (1, 3.0), (8, 3.0)]
        rng = np.random.default_rng(1)
        inputs: list[dict[str, Any]] = [{"x": rng.standard_normal((r, WIDTH), np.float32), "a": a} for r, a in plan]
        async with clients(fake.address, len(plan)) as gpus:
            steps = [await gpu.open_graph("merge-groups") for gpu in gpus]

            async def round_() -> bool:
                before = await device_counters(builder)
                outs = await replay_together(fake, steps, inputs)
                after = await device_counters(builder)
                for out, values in zip(outs, inputs, strict=True):
                    np.testing.assert_array_equal(out["y"], values["x"] * np.float32(values["a"]))
                # a = 1: 4 + 4 in the 8-row instance, then 2 alone; a = 3: 1 + 1 in the 2-row instance, then 8 alone
                counted = {k: after[k] - before[k] for k in after}
                return counted == {"merged_launches": 2, "merged_rows": 10, "row_launches": 2}

            await until_together(round_, "six replays grouped by scalars, past the largest instance")
        builder.unpublish_graph("merge-groups")


async def test_a_session_that_ends_before_its_slice_does_not_stop_the_others(fake: Daemon) -> None:
    async with gpud_client.connect(fake.address) as builder:
        await build_scale(builder, "merge-bye")
        x = np.arange(2 * WIDTH, dtype=np.float32).reshape(2, WIDTH)

        async def round_() -> bool:
            async with clients(fake.address, 3) as gpus:
                steps = [await gpu.open_graph("merge-bye") for gpu in gpus]
                leaving = gpus[2]._connection
                before = await device_counters(builder)
                with stopped(fake):
                    tasks = [asyncio.create_task(step.replay(x=x, a=2.0)) for step in steps[:2]]
                    steps[2].launch(x=x, a=2.0)
                    leaving.send_batch()
                    leaving._send_control(proto.BYE)  # its bye right behind its launch, in the same slice
                    await asyncio.sleep(SEND_S)
                outs = await asyncio.wait_for(asyncio.gather(*tasks), 20)
                after = await device_counters(builder)
                for out in outs:
                    np.testing.assert_array_equal(out["y"], x * 2)
                for step in steps[:2]:  # and they go on as before
                    np.testing.assert_array_equal((await step.replay(x=x, a=1.0))["y"], x)
                with pytest.raises(gpud_client.SessionLost):
                    await gpus[2].sync()
                return after["merged_rows"] - before["merged_rows"] == 4  # the two left, merged

        await until_together(round_, "the two sessions left merged")
        builder.unpublish_graph("merge-bye")
    fake.assert_alive()


async def test_a_row_independent_graph_is_checked_at_build(fake: Daemon) -> None:
    async with gpud_client.connect(fake.address) as gpu:
        k = await gpu.kernel("fake:scale", "scale")
        g = gpu.graph("rows-binds", rows=True)
        x = g.input("x", (2, WIDTH), "float32")
        y = g.bind("y", (2, WIDTH), "float32")
        g.dispatch(k, 2, [x, y, 1.0])
        g.output("y", y)
        with pytest.raises(InvalidArgument, match="binds no tensors"):
            await g.build()
        g = gpu.graph("rows-shapes", rows=True)
        x = g.input("x", (2, WIDTH), "float32")
        y = g.empty((1, 2 * WIDTH), "float32")
        g.dispatch(k, 2, [x, y, 1.0])
        g.output("y", y)
        with pytest.raises(InvalidArgument, match="one leading axis"):
            await g.build()
        g = gpu.graph("rows-mixed")  # built without rows=True first
        x = g.input("x", (1, WIDTH), "float32")
        y = g.empty((1, WIDTH), "float32")
        g.dispatch(k, 1, [x, y, 1.0])
        g.output("y", y)
        await g.build()
        g = gpu.graph("rows-mixed", rows=True)
        x = g.input("x", (2, WIDTH), "float32")
        y = g.empty((2, WIDTH), "float32")
        g.dispatch(k, 2, [x, y, 1.0])
        g.output("y", y)
        with pytest.raises(InvalidArgument, match="rows=False"):
            await g.build()
        await gpu.sync()


async def test_an_mlp_of_the_op_library_merged_on_every_backend(daemon: Daemon) -> None:
    """Linear -> GELU -> Linear over rows, built with `gpu.ops` for 1..8 rows and published; four sessions
    replay it at once: one launch, every session's rows close to numpy float64's."""
    rng = np.random.default_rng(2)
    w1, b1 = rng.standard_normal((96, 48)) / 7, rng.standard_normal(96) / 7
    w2, b2 = rng.standard_normal((32, 96)) / 10, rng.standard_normal(32) / 10
    name = f"merge-mlp-{os.getpid()}"
    async with gpud_client.connect(daemon.address) as builder:
        first = nn.Linear(builder, builder.tensor(w1.astype(np.float32)), builder.tensor(b1.astype(np.float32)))
        second = nn.Linear(builder, builder.tensor(w2.astype(np.float32)), builder.tensor(b2.astype(np.float32)))
        step = None
        for size in SIZES:
            g = builder.graph(name, rows=True)
            x = g.input("x", (size, 48), "float32")
            g.output("y", second(builder.ops.gelu(first(x, graph=g), graph=g), graph=g))
            step = await g.build()
        assert step is not None
        builder.publish_graph(step, name)
        await builder.sync()
        rows = [1, 2, 1, 4]
        inputs: list[dict[str, Any]] = [{"x": rng.standard_normal((r, 48)).astype(np.float32)} for r in rows]
        async with clients(daemon.address, len(rows)) as gpus:
            steps = [await gpu.open_graph(name) for gpu in gpus]

            async def round_() -> bool:
                before = await device_counters(builder)
                outs = await replay_together(daemon, steps, inputs)
                after = await device_counters(builder)
                for out, values in zip(outs, inputs, strict=True):
                    h = values["x"].astype(np.float64) @ w1.T + b1
                    h = 0.5 * h * (1 + np.vectorize(math.erf)(h / math.sqrt(2)))
                    np.testing.assert_allclose(out["y"], h @ w2.T + b2, rtol=1e-4, atol=1e-4)
                return after["merged_launches"] - before["merged_launches"] == 1

            await until_together(round_, "four replays of the MLP in one launch")
        builder.unpublish_graph(name)
        step.free()
        for t in (first.weight, first.bias, second.weight, second.bias):
            t.free()
        await builder.sync()

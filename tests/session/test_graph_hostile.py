"""Replay graphs a client gets wrong, on purpose or not: the fault is that graph's, never another session's.

Issue 14 §2.1: a copy step whose source and destination are one buffer (a tensor and itself, a
view of it, two inputs of the one packed buffer, a bound tensor and the tensor it is bound to) was
built and replayed without a word, and WebGPU then refused the whole shared submission: a
bystander's upload in it was dropped. §2.2: a build that failed after a recorded upload kept that
upload's buffer forever, charged to nobody.

The daemons here run on the fake backend (which refuses a same-buffer copy at submit, as wgpu does)
and on webgpu (lavapipe), with a 10 s flush deadline: work stays pending until a result is awaited,
so a bystander's upload and the faulty session's work go into one submission.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import numpy as np
import pytest
from conftest import Connection
from support import Daemon, axpb, wait_for_memory

import gpud_client
from gpud.testing import spawn
from gpud_client import InvalidArgument, OutOfMemory, u32

SAME = r"copy step \d+: source and destination are the same memory"
QUOTA = 4 << 20
EMPTY = {"memory_in_use": 0, "live_buffers": 0}  # this module's daemon, between tests


@pytest.fixture(scope="module", params=["fake", "webgpu"])
def daemon(request: pytest.FixtureRequest) -> Iterator[Daemon]:
    args = (
        "--devices", "0",
        "--flush-deadline-ms", "10000",  # nothing is submitted before a result is awaited
        "--staging-pool-bytes", str(1 << 20),  # 512 KiB for uploads: a 1 MiB recording waits for staging
        "--session-memory-bytes", str(QUOTA),
    )  # fmt: skip
    with spawn.daemon(request.param, extra_args=args) as (address, proc):
        yield Daemon(address, proc, request.param)


@pytest.fixture
async def pair(daemon: Daemon) -> AsyncIterator[tuple[gpud_client.Client, gpud_client.Client]]:
    connections = [Connection(daemon.address), Connection(daemon.address)]
    gpu, bystander = [await c.open() for c in connections]  # see conftest: a connection lives in a task
    yield gpu, bystander
    for connection in connections:
        await connection.close()
    daemon.assert_alive()


async def _bystander_intact(bystander: gpud_client.Client, fault: Callable[[], Awaitable[Any]], match: str) -> None:
    """`fault()` must raise InvalidArgument matching `match`, while a bystander's upload waits in
    the same pending command buffer; the bystander's data must come back whole."""
    data = np.random.default_rng().standard_normal(4096).astype(np.float32)
    mine = bystander.tensor(data)
    await bystander.stats()  # the upload is encoded, not submitted (the flush deadline is 10 s)
    with pytest.raises(InvalidArgument, match=match):
        await fault()
    np.testing.assert_array_equal(await mine.numpy(), data)
    mine.free()


async def _build_and_run(gpu: gpud_client.Client, graph: gpud_client.Graph, **values: Any) -> None:
    step = await graph.build()
    step.launch(**values)
    await gpu.sync()


def _case_tensor_onto_itself(gpu: gpud_client.Client, g: gpud_client.Graph) -> None:
    t = gpu.tensor(np.arange(64, dtype=np.float32))
    g.copy(t, t)


def _case_temp_onto_its_view(gpu: gpud_client.Client, g: gpud_client.Graph) -> None:
    tmp = g.empty((64,))
    g.copy(tmp, tmp.reshape(64))


def _case_tensor_onto_its_graph_view(gpu: gpud_client.Client, g: gpud_client.Graph) -> None:
    t = gpu.tensor(np.arange(64, dtype=np.float32))
    g.copy(t.reshape(8, 8), g.view(t, (8, 8)))  # a session reshape handle onto a graph view


def _case_two_reshape_handles(gpu: gpud_client.Client, g: gpud_client.Graph) -> None:
    t = gpu.tensor(np.arange(64, dtype=np.float32))
    g.copy(t.reshape(8, 8), t.reshape(8, 8))


def _case_input_onto_input(gpu: gpud_client.Client, g: gpud_client.Graph) -> None:
    a, b = g.input("a", (64,)), g.input("b", (64,))  # packed into one buffer
    g.copy(a, b)


def _case_bind_onto_itself(gpu: gpud_client.Client, g: gpud_client.Graph) -> None:
    b = g.bind("b", (64,))
    g.copy(b, b.reshape(64))


BUILD_CASES = {
    "tensor onto itself": _case_tensor_onto_itself,
    "intermediate onto a view of itself": _case_temp_onto_its_view,
    "session reshape onto a graph view of it": _case_tensor_onto_its_graph_view,
    "two reshape handles of one tensor": _case_two_reshape_handles,
    "input 0 onto input 1": _case_input_onto_input,
    "bound tensor onto itself": _case_bind_onto_itself,
}


@pytest.mark.parametrize("case", list(BUILD_CASES))
async def test_a_copy_within_one_buffer_is_refused_at_build(
    pair: tuple[gpud_client.Client, gpud_client.Client], case: str
) -> None:
    gpu, bystander = pair
    g = gpu.graph(f"alias-{list(BUILD_CASES).index(case)}")
    ok = g.empty((4,))
    g.copy(ok, g.empty((4,)))  # step 0 is fine: the error names step 1
    BUILD_CASES[case](gpu, g)
    values: dict[str, Any] = {}
    if "input" in case:
        values = {"a": np.ones(64, np.float32), "b": np.ones(64, np.float32)}
    if "bound" in case:
        values = {"b": gpu.empty(64)}
    await _bystander_intact(bystander, lambda: _build_and_run(gpu, g, **values), SAME.replace(r"\d+", "1"))
    stats = (await gpu.stats())["session"]
    assert stats["graphs"] == 0 and stats["requests_in_flight"] == 0


async def test_bound_tensors_that_are_one_buffer_are_refused_at_replay(
    pair: tuple[gpud_client.Client, gpud_client.Client],
) -> None:
    gpu, bystander = pair
    fixed = gpu.tensor(np.arange(64, dtype=np.float32))
    g = gpu.graph("bound-alias")
    a, b = g.bind("a", (64,)), g.bind("b", (8, 8))
    g.copy(a, b.reshape(64))  # step 0: two bound names
    g.copy(a, fixed)  # step 1: a bound tensor onto a fixed one
    g.output("b", b)
    step = await g.build()
    t, u, v = gpu.tensor(np.full(64, 7, np.float32)), gpu.empty((8, 8)), gpu.empty(64)

    async def replay(**values: Any) -> None:
        await step.replay(**values)

    async def launch(**values: Any) -> None:
        step.launch(**values)
        await gpu.sync()

    # Two names bound to one tensor (through another handle of it), by a replay and by a launch.
    await _bystander_intact(bystander, lambda: replay(a=t, b=t.reshape(8, 8)), r"copy step 0: .*same memory")
    await _bystander_intact(bystander, lambda: launch(a=t, b=t.reshape(8, 8)), r"copy step 0: .*same memory")
    # A bound tensor onto the fixed tensor it is bound to.
    await _bystander_intact(bystander, lambda: replay(a=fixed, b=u), r"copy step 1: .*same memory")
    stats = (await gpu.stats())["session"]
    assert stats["requests_in_flight"] == 0 and stats["reply_bytes_reserved"] == 0
    # The same graph with tensors of their own works.
    got = await step.replay(a=t, b=u)
    np.testing.assert_array_equal(got["b"], np.full((8, 8), 7, np.float32))
    np.testing.assert_array_equal(await fixed.numpy(), np.full(64, 7, np.float32))
    await step.replay(a=v, b=u)


async def test_a_plain_copy_of_a_tensor_onto_itself_changes_nothing(
    pair: tuple[gpud_client.Client, gpud_client.Client],
) -> None:
    """Unlike a graph's copy step, `gpu.copy` of a tensor onto itself (through any of its handles)
    is nothing to do: it is never encoded, so it cannot fail a shared submission."""
    gpu, bystander = pair
    t = gpu.tensor(np.arange(64, dtype=np.float32))
    data = np.random.default_rng().standard_normal(4096).astype(np.float32)
    mine = bystander.tensor(data)
    await bystander.stats()  # pending, in the same command buffer as the copies
    gpu.copy(t, t)
    gpu.copy(t.reshape(8, 8), t.reshape(8, 8))
    await gpu.sync()
    np.testing.assert_array_equal(await t.numpy(), np.arange(64, dtype=np.float32))
    np.testing.assert_array_equal(await mine.numpy(), data)


async def test_a_dispatch_step_binding_one_buffer_read_only_and_read_write_is_refused_at_build(
    pair: tuple[gpud_client.Client, gpud_client.Client], daemon: Daemon
) -> None:
    if daemon.backend != "webgpu":
        pytest.skip("only WebGPU refuses one buffer bound read-only and read-write")
    gpu, bystander = pair
    k = await axpb(gpu)
    g = gpu.graph("dispatch-alias")
    a, b = g.input("a", (64,)), g.input("b", (64,))
    g.dispatch(k, 1, [a, b, 1.0, 0.0, u32(64)])
    with pytest.raises(InvalidArgument, match=r"dispatch step 0 \(axpb\): .*same memory"):
        await g.build()
    g = gpu.graph("dispatch-alias-bound")
    c, d = g.bind("c", (64,)), g.bind("d", (64,))
    g.dispatch(k, 1, [c, d, 1.0, 0.0, u32(64)])
    step = await g.build()
    t = gpu.empty(64)
    await _bystander_intact(bystander, lambda: step.replay(c=t, d=t), r"dispatch step 0 \(axpb\): .*same memory")
    await step.replay(c=t, d=gpu.empty(64))


# ---------------------------------------------------------------------------------------- leaks


def _failing_after_an_upload(gpu: gpud_client.Client, nbytes: int, name: str) -> gpud_client.Graph:
    g = gpu.graph(name)
    t = g.empty((nbytes // 4,))
    g.upload(t, np.ones(nbytes // 4, np.float32))  # step 0: a recorded upload
    g.copy(g.empty((4,)), g.empty((8,)))  # step 1: a shape mismatch
    return g


@pytest.mark.parametrize("nbytes", [4096, 1 << 20], ids=["4KiB", "1MiB-more-than-the-staging-pool"])
async def test_a_failed_build_keeps_none_of_its_recorded_uploads(daemon: Daemon, nbytes: int) -> None:
    baseline = await wait_for_memory(daemon.address, EMPTY)  # the sessions of earlier tests are gone
    async with gpud_client.connect(daemon.address) as gpu:
        before = (await gpu.stats())["session"]["private_bytes"]
        for i in range(3):
            with pytest.raises(InvalidArgument, match="graph step 1"):
                await _failing_after_an_upload(gpu, nbytes, f"leak{i}").build()
        await gpu.sync()
        assert (await gpu.stats())["session"]["private_bytes"] == before
        await wait_for_memory(daemon.address, baseline)
    await wait_for_memory(daemon.address, baseline)


async def test_recorded_uploads_are_charged_while_they_live(daemon: Daemon) -> None:
    baseline = await wait_for_memory(daemon.address, EMPTY)  # the sessions of earlier tests are gone
    async with gpud_client.connect(daemon.address) as gpu:
        before = (await gpu.stats())["session"]["private_bytes"]
        data = np.arange(1 << 18, dtype=np.float32)  # 1 MiB: more than the upload staging holds at once
        g = gpu.graph("charged")
        t = g.empty(data.shape)
        g.upload(t, data)
        g.output("t", t)
        step = await g.build()
        assert (await gpu.stats())["session"]["private_bytes"] >= before + 2 * data.nbytes  # the recording, t
        np.testing.assert_array_equal((await step.replay())["t"], data)
        step.free()
        await gpu.sync()
        assert (await gpu.stats())["session"]["private_bytes"] == before
        # Recorded uploads beyond the quota: refused before anything is allocated.
        g = gpu.graph("too-large")
        big = g.empty((QUOTA // 4,))
        g.upload(big, np.zeros(QUOTA // 4, np.float32))
        with pytest.raises(OutOfMemory, match="quota"):
            await g.build()
        assert (await gpu.stats())["session"]["private_bytes"] == before
        await wait_for_memory(daemon.address, baseline)
    await wait_for_memory(daemon.address, baseline)


async def test_a_published_graph_refused_for_one_session_still_serves_another(daemon: Daemon) -> None:
    name = f"test/alias-{uuid.uuid4().hex[:8]}"
    async with gpud_client.connect(daemon.address) as owner, gpud_client.connect(daemon.address) as other:
        g = owner.graph("shared-alias")
        a, b = g.bind("a", (64,)), g.bind("b", (64,))
        g.copy(a, b)
        owner.publish_graph(await g.build(), name)
        await owner.flush()
        mine = await other.open_graph(name)
        t = other.tensor(np.full(64, 3, np.float32))
        with pytest.raises(InvalidArgument, match=r"copy step 0: .*same memory"):
            await mine.replay(a=t, b=t)
        u = other.empty(64)
        await mine.replay(a=t, b=u)
        np.testing.assert_array_equal(await u.numpy(), np.full(64, 3, np.float32))
        mine.free()
        owner.unpublish_graph(name)
        await owner.flush()

"""Replay graphs: a step recorded once, replayed in one message, equal to the same ops run eagerly."""

from __future__ import annotations

import asyncio
import uuid

import numpy as np
import pytest
from runtime.test_runtime import make
from support import Daemon, axpb, device_memory, wait_for_memory

import gpud_client
from gpud.backends.base import Buffer
from gpud.session.graphs import Family, Instance, Signature
from gpud_client import InvalidArgument, NotFound, PermissionDenied, u32

N = 1000


async def _chain_graph(gpu: gpud_client.Client, name: str, n: int = N) -> gpud_client.Step:
    """x -> t = x * a + 1 -> out = t * 2 + b, reading back t; a is a graph scalar, out a bound tensor."""
    k = await axpb(gpu)
    g = gpu.graph(name)
    x = g.input("x", (n,), "float32")
    a = g.scalar("a", "f32")
    out = g.bind("out", (n,), "float32")
    t = g.empty((n,), "float32")
    groups = (n + 63) // 64
    g.dispatch(k, groups, [x, t, a, 1.0, u32(n)])
    g.dispatch(k, groups, [t, out, 2.0, 0.5, u32(n)])
    g.output("t", t)
    return await g.build()


async def _eager(gpu: gpud_client.Client, x: np.ndarray, a: float) -> tuple[np.ndarray, np.ndarray]:
    k = await axpb(gpu)
    n = x.size
    tx, tt, to = gpu.tensor(x), gpu.empty(n), gpu.empty(n)
    groups = (n + 63) // 64
    gpu.dispatch(k, groups, [tx, tt, a, 1.0, u32(n)])
    gpu.dispatch(k, groups, [tt, to, 2.0, 0.5, u32(n)])
    result = await tt.numpy(), await to.numpy()
    for t in (tx, tt, to):
        t.free()
    return result


async def test_replays_equal_the_same_ops_run_eagerly_bit_for_bit(gpu: gpud_client.Client) -> None:
    step = await _chain_graph(gpu, "eq")
    out = gpu.empty(N)
    rng = np.random.default_rng(7)
    for _ in range(100):
        x = rng.standard_normal(N).astype(np.float32)
        a = float(rng.standard_normal())
        replayed = await step.replay(x=x, a=a, out=out)
        t, o = await _eager(gpu, x, a)
        np.testing.assert_array_equal(replayed["t"], t)
        np.testing.assert_array_equal(await out.numpy(), o)
    step.free()


async def test_launch_queues_a_replay_without_readback(gpu: gpud_client.Client) -> None:
    step = await _chain_graph(gpu, "launch")
    out = gpu.empty(N)
    x = np.linspace(-1, 1, N, dtype=np.float32)
    for a in (1.0, 2.0, 3.0):
        step.launch(x=x, a=a, out=out)
    _, expect = await _eager(gpu, x, 3.0)
    np.testing.assert_array_equal(await out.numpy(), expect)


async def test_a_published_graph_replayed_by_several_sessions_at_once(gpu: gpud_client.Client, address: str) -> None:
    name = f"test/graph-{uuid.uuid4().hex[:8]}"
    step = await _chain_graph(gpu, "shared")
    gpu.publish_graph(step, name)
    await gpu.flush()

    async def client(seed: int) -> None:
        async with gpud_client.connect(address, device=step.device) as other:
            mine = await other.open_graph(name)
            assert mine.inputs == [("x", "float32")] and mine.outputs == ["t"]
            out = other.empty(N, device=mine.device)
            rng = np.random.default_rng(seed)
            for _ in range(25):
                x = rng.standard_normal(N).astype(np.float32)
                a = float(rng.standard_normal())
                result = await mine.replay(x=x, a=a, out=out)
                t, o = await _eager(other, x, a)
                np.testing.assert_array_equal(result["t"], t)  # nobody else's replay overwrote it
                np.testing.assert_array_equal(await out.numpy(), o)
            mine.free()

    await asyncio.gather(*(client(seed) for seed in range(3)))
    gpu.unpublish_graph(name)
    await gpu.flush()


async def test_one_instance_per_input_shape(gpu: gpud_client.Client) -> None:
    big = await _chain_graph(gpu, "shapes", 4096)
    small = await _chain_graph(gpu, "shapes", 64)
    assert big.handle == small.handle  # one graph, two instances
    for n, step in ((64, small), (4096, big)):
        out = gpu.empty(n)
        x = np.arange(n, dtype=np.float32)
        result = await step.replay(x=x, a=0.5, out=out)
        t, o = await _eager(gpu, x, 0.5)
        np.testing.assert_array_equal(result["t"], t)
        np.testing.assert_array_equal(await out.numpy(), o)
    with pytest.raises(NotFound, match="no instance"):
        await big.replay(x=np.ones(100, np.float32), a=1.0, out=gpu.empty(100))


async def test_recorded_uploads_and_copies(gpu: gpud_client.Client) -> None:
    g = gpu.graph("uploads")
    x = g.input("x", (8,), "int32")
    a, b = g.empty((8,), "int32"), g.empty((8,), "int32")
    g.upload(a, np.arange(8, dtype=np.int32) * 10)  # applied at this point of every replay
    g.copy(x, b)
    g.output("a", a)
    g.output("b", b)
    step = await g.build()
    for i in range(3):
        result = await step.replay(x=np.full(8, i, np.int32))
        np.testing.assert_array_equal(result["a"], np.arange(8, dtype=np.int32) * 10)
        np.testing.assert_array_equal(result["b"], np.full(8, i, np.int32))


async def test_host_data_keeps_its_dtype_in_tensors_and_replays(gpu: gpud_client.Client) -> None:
    """Regression: a float64 array given to a float32 input was converted silently, while
    `gpu.tensor` of the same array keeps float64. Neither converts: a replay refuses the mismatch."""
    step = await _chain_graph(gpu, "dtypes", 8)
    out = gpu.empty(8)
    x64 = np.arange(8, dtype=np.float64)
    assert gpu.tensor(x64).dtype == np.float64
    for wrong in (x64, x64.tolist(), np.arange(8, dtype=np.float16)):
        with pytest.raises(InvalidArgument, match=r"input 'x' is float32, got float(64|16)") as info:
            step.launch(x=wrong, a=1.0, out=out)  # refused at the call: nothing was sent
        assert info.value.seq is None
    got = await step.replay(x=x64.astype(np.float32), a=2.0, out=out)
    np.testing.assert_array_equal(got["t"], x64.astype(np.float32) * 2 + 1)
    step.free()


async def test_bad_replays_are_typed_errors(gpu: gpud_client.Client) -> None:
    step = await _chain_graph(gpu, "bad")
    out = gpu.empty(N)
    x = np.ones(N, np.float32)
    with pytest.raises(InvalidArgument, match="needs"):
        await step.replay(x=x, a=1.0)
    with pytest.raises(InvalidArgument, match="no input"):
        await step.replay(x=x, a=1.0, out=out, y=2)
    with pytest.raises(InvalidArgument, match="bound tensor 'out'"):
        await step.replay(x=x, a=1.0, out=gpu.empty(N + 1))
    with pytest.raises(InvalidArgument, match="32-bit float"):
        await step.replay(x=x, a=1e300, out=out)
    step.free()
    with pytest.raises(InvalidArgument, match="freed"):
        await step.replay(x=x, a=1.0, out=out)
    ghost = gpud_client.Step(gpu, 9_999_999, "ghost", 0, [], [], [], [])
    with pytest.raises(NotFound, match="graph"):
        await ghost.replay()


async def test_a_graph_keeps_the_tensors_it_uses_alive(gpu: gpud_client.Client) -> None:
    """Freeing a session tensor a graph uses is deferred: no replay touches freed memory."""
    k = await axpb(gpu)
    w = gpu.tensor(np.full(64, 3.0, np.float32))
    g = gpu.graph("holds")
    out = g.empty((64,))
    g.dispatch(k, 1, [w, out, 2.0, 0.0, u32(64)])
    g.output("out", out)
    step = await g.build()
    w.free()
    for _ in range(3):
        np.testing.assert_array_equal((await step.replay())["out"], np.full(64, 6.0, np.float32))


async def test_a_read_only_resident_written_by_a_graph_is_refused(gpu: gpud_client.Client, address: str) -> None:
    name = f"test/ro-graph-{uuid.uuid4().hex[:8]}"
    async with gpud_client.connect(address, device=gpu.device) as owner:
        owner.publish(owner.tensor(np.ones(64, np.float32)), name, "ro")
        await owner.flush()
        w = await gpu.open(name)
        k = await axpb(gpu)
        g = gpu.graph("ro")
        g.dispatch(k, 1, [g.input("x", (64,)), w, 1.0, 0.0, u32(64)])
        with pytest.raises(PermissionDenied):
            await g.build()
        owner.unpublish(name)


async def test_freeing_graphs_returns_their_memory(address: str) -> None:
    baseline = await device_memory(address)
    async with gpud_client.connect(address) as gpu:
        for i in range(5):
            step = await _chain_graph(gpu, f"free{i}")
            await step.replay(x=np.ones(N, np.float32), a=1.0, out=gpu.empty(N))
            step.free()
    await wait_for_memory(address, baseline)


async def test_graph_bounds(daemon: Daemon) -> None:
    from gpud.testing import spawn

    bounds = ("--session-max-graphs", "2", "--graph-instances", "2", "--devices", "0")
    with spawn.daemon(daemon.backend, extra_args=bounds) as (addr, _):  # the parameter's backend, not always webgpu
        async with gpud_client.connect(addr) as gpu:
            await _chain_graph(gpu, "g1")
            await _chain_graph(gpu, "g2")
            with pytest.raises(Exception, match="graphs"):
                await _chain_graph(gpu, "g3")
            steps = [await _chain_graph(gpu, "g1", n) for n in (64, 128, 256)]
            with pytest.raises(NotFound, match="no instance"):  # the first instance (n=1000) was evicted
                await steps[0].replay(x=np.ones(N, np.float32), a=1.0, out=gpu.empty(N))
            await steps[2].replay(x=np.ones(256, np.float32), a=1.0, out=gpu.empty(256))


async def test_a_built_in_op_takes_no_per_replay_scalar(gpu: gpud_client.Client) -> None:
    """Its rule bounds what it reads from the scalars: they are checked once, at build."""
    g = gpu.graph("builtin-scalar")
    x = g.input("x", (64,), "float32")
    out = g.empty((64,), "float32")
    n = g.scalar("n", "u32")
    u32, f32 = gpud_client.u32, gpud_client.f32
    g.dispatch(gpu.ops._kernel("ew_unary"), 1, [x, out, n, u32(0), f32(1.0), f32(0.0), u32(0), u32(0)])
    g.output("out", out)
    with pytest.raises(gpud_client.InvalidArgument, match="per-replay scalars") as info:
        await g.build()
    assert info.value.op == "graph"


async def test_a_familys_own_memory_is_released_after_its_last_replay() -> None:
    """A replay leaves the family's slots and recorded uploads unmarked (`Family.last_use` covers
    them): every way they are released marks them with the family's last replay first."""
    rt, _lost = make()

    def instance(constant: Buffer) -> Instance:
        return Instance(((4,),), [], 0, [], [], 0, (), frozenset(), (), [], [], [], [constant])

    family = Family("f", "s1", rt, Signature((), (), (), ()), None)
    first = rt.alloc(256)
    assert family.add(instance(first)) == []
    family.last_use = 7
    released = family.add(instance(rt.alloc(256)))  # the same shapes: the old instance goes
    assert released == [first] and first.last_use == 7
    family.last_use = 9
    released = family.release_all()
    assert len(released) == 3 and all(b.last_use == 9 for b in released)  # its constant, "in", "out"
    await rt.close()

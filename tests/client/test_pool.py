"""The pool of freed op-library outputs (gpud_client.pool): a freed output's handle serves the next output
of exactly its device, dtype and shape, without an Alloc or a Free; never twice, never to a stale
`Tensor`, never while the daemon holds the memory for longer than the ops queued so far; bounded; given
back by `trim()` and before an OutOfMemory reaches the caller. Counted on the client's counters
(`pool_stats()`), never timed."""

from __future__ import annotations

import gc
import uuid

import numpy as np
import pytest

import gpud_client
from gpud.testing import spawn
from gpud.testing.bert import CONFIGS, Encoder, random_weights
from gpud_client import InvalidArgument, NotFound, OutOfMemory
from gpud_client.pool import POOL_BYTES, POOL_ENTRIES, Origin, Pool

KiB = 1 << 10


def origin(
    seq: int, shape: tuple[int, ...] = (4,), dtype: str = "float32", device: int = 0, nbytes: int = 16
) -> Origin:
    return Origin((device, dtype, shape), seq, nbytes)


def sent(gpu: gpud_client.Client) -> tuple[int, int]:
    stats = gpu.pool_stats()
    return stats["allocs"], stats["frees"]


# ------------------------------------------------------------------ the pool alone


def test_keys_are_exact_and_a_handle_is_taken_once() -> None:
    pool = Pool()
    assert pool.put(1, origin(10)) == []
    assert pool.put(2, origin(11)) == []
    for other in (origin(0, dtype="int32"), origin(0, shape=(2, 2)), origin(0, shape=(4, 1)), origin(0, device=1)):
        assert pool.take(other.key) is None  # same bytes, another key: never shared
    assert pool.take(origin(0).key) == (1, origin(10))  # the least recently pooled first: a loop gets the same
    assert pool.take(origin(0).key) == (2, origin(11))
    assert pool.take(origin(0).key) is None
    assert len(pool) == 0 and pool.nbytes == 0 and (pool.hits, pool.misses) == (2, 5)
    pool.put(3, origin(12))
    with pytest.raises(AssertionError):
        pool.put(3, origin(12))  # a handle pooled twice would be handed out twice


def test_bounds_evict_the_least_recently_pooled_one_at_a_time() -> None:
    pool = Pool(max_bytes=100, max_entries=3)
    assert [pool.put(h, origin(h, shape=(h,), nbytes=30)) for h in (1, 2, 3)] == [[], [], []]
    assert pool.put(4, origin(4, nbytes=30)) == [1]  # 4 entries > 3: the oldest goes
    assert pool.put(5, origin(5, nbytes=30)) == [2]
    assert pool.put(6, origin(6, nbytes=60)) == [3, 4]  # 120 + 60 bytes > 100: two go, one at a time
    assert sorted(pool._order) == [5, 6] and pool.nbytes == 90 and pool.evictions == 4
    assert pool.put(7, origin(7, nbytes=101)) == [7]  # larger than the pool: freed at once
    assert pool.limit(60, 3) == [5]
    assert sorted(pool.clear()) == [6] and len(pool) == 0 and pool.nbytes == 0
    off = Pool(max_bytes=0, max_entries=0)
    assert off.put(8, origin(8)) == [8]


def test_a_refused_allocation_is_never_pooled() -> None:
    pool = Pool()
    pool.put(1, origin(10))
    pool.put(2, origin(11))
    pool.failed(10)  # pooled before the client heard: dropped, nothing to free
    assert 1 not in pool and 2 in pool and pool.evictions == 0
    pool.failed(12)
    assert pool.put(3, origin(12)) is None  # freed after: neither pooled nor freed


# ------------------------------------------------------------------ on a daemon


async def test_a_freed_output_serves_the_next_output_of_its_key(gpu: gpud_client.Client) -> None:
    x = gpu.tensor(np.arange(8, dtype=np.float32))
    y = gpu.tensor(np.full(8, 10, np.float32))
    a = gpu.ops.add(x, y)
    b = gpu.ops.add(x, y)
    handles = {a.handle, b.handle}
    a.free()
    b.free()
    allocs, frees = sent(gpu)
    c = gpu.ops.mul(x, y)  # takes a pooled handle: no Alloc
    d = gpu.ops.sub(y, x)
    e = gpu.ops.add(x, x)  # the pool is empty for this key now: a new one
    assert {c.handle, d.handle} == handles and e.handle not in handles
    assert sent(gpu) == (allocs + 1, frees)
    np.testing.assert_array_equal(await c.numpy(), np.arange(8) * 10)  # each op writes its whole output
    np.testing.assert_array_equal(await d.numpy(), 10 - np.arange(8))
    c.free()
    d.free()
    ones = np.ones(8, np.float32)
    others = [gpu.ops.cast(x, "int32"), gpu.ops.add(x.reshape(2, 4), y.reshape(2, 4)), gpu.empty(8)]
    assert not {t.handle for t in others} & handles  # another dtype or shape; empty(), which is zeros
    assert len(gpu._pool) == 2
    np.testing.assert_array_equal(await others[2].numpy(), np.zeros(8))
    upload = gpu.tensor(ones)  # an upload writes every byte: it may take a pooled handle of its key
    assert upload.handle in handles and len(gpu._pool) == 1
    np.testing.assert_array_equal(await upload.numpy(), ones)


async def test_a_stale_tensor_and_its_views_raise_after_their_handle_is_reused(gpu: gpud_client.Client) -> None:
    x = gpu.tensor(np.arange(8, dtype=np.float32))
    a = gpu.ops.scale(x, 2.0)
    view = a.reshape(2, 4)  # a live view of a base freed by hand: the view ends with it
    a.free()
    b = gpu.ops.scale(x, 3.0)
    assert b.handle == a.handle and a.freed and view.freed
    for stale in (a, view):
        with pytest.raises(InvalidArgument, match="freed"):
            await stale.numpy()
        with pytest.raises(InvalidArgument, match="freed"):
            gpu.ops.exp(stale)
        with pytest.raises(InvalidArgument, match="freed"):
            gpu.ops.scale(x.reshape(stale.shape), 1.0, out=stale)
    a.free()  # freeing it again does nothing: b keeps its handle
    assert b.handle not in gpu._pool
    np.testing.assert_array_equal(await b.numpy(), np.arange(8) * 3)


async def test_ops_queued_before_the_reuse_read_the_old_data(gpu: gpud_client.Client) -> None:
    x = gpu.tensor(np.arange(8, dtype=np.float32))
    y = gpu.tensor(np.full(8, 10, np.float32))
    z = gpu.ops.add(x, y)
    w = gpu.ops.mul(z, x)  # reads z, queued
    out = gpu.ops.scale(x, 0.0)
    gpu.ops.sub(z.reshape(2, 4), x.reshape(2, 4), out=out.reshape(2, 4))  # reads z through a view, into out=
    z.free()
    n = gpu.ops.scale(y, -1.0)  # writes z's memory, after the ops above
    assert n.handle == z.handle
    out.free()
    o = gpu.ops.scale(x, 5.0)  # writes out's memory, after the sub wrote it
    assert o.handle == out.handle
    np.testing.assert_array_equal(await w.numpy(), (np.arange(8) + 10) * np.arange(8))
    np.testing.assert_array_equal(await n.numpy(), np.full(8, -10))
    np.testing.assert_array_equal(await o.numpy(), np.arange(8) * 5)


async def test_an_output_python_drops_is_pooled_but_not_while_a_view_holds_it(gpu: gpud_client.Client) -> None:
    x = gpu.tensor(np.arange(8, dtype=np.float32))
    gc.disable()  # dropped by reference counting alone, at once
    try:
        handle = gpu.ops.scale(x, 2.0).handle  # the output is dropped unfreed
        assert gpu.ops.scale(x, 3.0).handle == handle  # and pooled: the next call (dropped too) takes it
        view = gpu.ops.scale(x, 4.0).reshape(2, 4)  # the view holds its base
        held = view.base.handle
        other = gpu.ops.scale(x, 5.0)
        assert other.handle != held
        np.testing.assert_array_equal(await view.numpy(), np.arange(8).reshape(2, 4) * 4)
        del view
        assert gpu.ops.scale(x, 6.0).handle == held
    finally:
        gc.enable()


async def test_published_and_recorded_tensors_are_never_pooled(gpu: gpud_client.Client) -> None:
    x = gpu.tensor(np.arange(8, dtype=np.float32))
    name = f"test/pool-{uuid.uuid4().hex[:8]}"
    published = gpu.ops.scale(x, 2.0)
    gpu.publish(published, name, "ro")
    constant = gpu.ops.scale(x, 3.0)  # recorded into a graph: the graph holds its memory
    g = gpu.graph(f"pool-{uuid.uuid4().hex[:8]}")
    inp = g.input("i", 8, "float32")
    g.output("o", gpu.ops.add(inp, constant, graph=g))
    step = await g.build()
    allocs, frees = sent(gpu)
    published.free()
    constant.free()
    assert sent(gpu) == (allocs, frees + 2) and len(gpu._pool) == 0  # freed as before, not pooled
    for _ in range(2):
        assert gpu.ops.scale(x, -1.0).handle not in (published.handle, constant.handle)
    np.testing.assert_array_equal((await step.replay(i=np.ones(8, np.float32)))["o"], np.arange(8) * 3 + 1)
    opened = await gpu.open(name)
    np.testing.assert_array_equal(await opened.numpy(), np.arange(8) * 2)
    opened.free()
    gpu.unpublish(name)
    step.free()


async def test_a_bound_tensor_freed_after_a_launch_is_reused_after_it(gpu: gpud_client.Client) -> None:
    x = gpu.tensor(np.arange(8, dtype=np.float32))
    g = gpu.graph(f"pool-bind-{uuid.uuid4().hex[:8]}")
    src, dst = g.bind("src", 8, "float32"), g.bind("dst", 8, "float32")
    gpu.ops.scale(src, 2.0, out=dst, graph=g)
    step = await g.build()
    bound = gpu.ops.scale(x, 3.0)
    result = gpu.empty(8)
    step.launch(src=bound, dst=result)  # queued, no reply: it reads `bound`
    bound.free()
    assert gpu.ops.scale(x, -7.0).handle == bound.handle  # writes that memory after the launch read it
    np.testing.assert_array_equal(await result.numpy(), np.arange(8) * 6)
    step.free()


async def test_kept_tensors_are_not_pooled_at_the_scopes_exit(gpu: gpud_client.Client) -> None:
    x = gpu.tensor(np.arange(8, dtype=np.float32))
    async with gpu.scope() as scope:
        kept = scope.keep(gpu.ops.scale(x, 2.0))
        dropped = gpu.ops.scale(x, 3.0)
    assert not kept.freed and dropped.freed and kept.handle not in gpu._pool and dropped.handle in gpu._pool
    again = [gpu.ops.scale(x, 4.0) for _ in range(2)]
    assert kept.handle not in {t.handle for t in again} and dropped.handle in {t.handle for t in again}
    np.testing.assert_array_equal(await kept.numpy(), np.arange(8) * 2)


async def test_the_attention_scratch_outlives_the_scope_it_was_made_in(gpu: gpud_client.Client) -> None:
    rng = np.random.default_rng(0)
    q, k, v = (
        gpu.tensor(rng.standard_normal((2, 4, 8), np.float32)),
        *(gpu.tensor(rng.standard_normal((2, 40, 2, 8), np.float32)) for _ in range(2)),
    )
    pos = gpu.tensor(np.array([5, 39], np.int32))
    results = []
    for _ in range(3):
        before = sent(gpu)
        async with gpu.scope():
            results.append(await gpu.ops.attention_decode(q, k, v, pos, splits=2).numpy())
        counts = [after - b for after, b in zip(sent(gpu), before, strict=True)]
    assert counts == [0, 0]  # neither the output (pooled) nor the scratch (kept by the op) is made again
    np.testing.assert_array_equal(results[0], results[2])


async def test_bounds_trim_and_counters(gpu: gpud_client.Client) -> None:
    x = gpu.tensor(np.arange(256, dtype=np.float32))
    await gpu.sync()
    baseline = (await gpu.stats())["session"]
    gpu.set_pool_limits(3 * KiB, 2)
    made = [gpu.ops.scale(x.reshape(s, 256 // s), 1.0) for s in (1, 2, 4, 8)]  # 1 KiB each, 4 keys
    allocs, frees = sent(gpu)
    for t in made:
        t.free()
    stats = gpu.pool_stats()
    assert (stats["entries"], stats["bytes"], stats["evictions"]) == (2, 2 * KiB, 2)
    assert (stats["allocs"], stats["frees"]) == (allocs, frees + 2)  # the two least recently pooled went
    assert {made[2].handle, made[3].handle} == set(gpu._pool._order)
    session = (await gpu.stats())["session"]
    assert session["private_bytes"] == baseline["private_bytes"] + 2 * KiB  # pooled memory is the session's
    assert gpu.trim() == 2 * KiB
    assert gpu.pool_stats()["entries"] == 0 and sent(gpu) == (allocs, frees + 4)
    session = (await gpu.stats())["session"]
    assert (session["private_bytes"], session["handles"]) == (baseline["private_bytes"], baseline["handles"])
    gpu.set_pool_limits(0, 0)  # off: a free is a Free
    gpu.ops.scale(x, 1.0).free()
    assert gpu.pool_stats()["entries"] == 0 and sent(gpu)[1] == frees + 5
    with pytest.raises(InvalidArgument):
        gpu.set_pool_limits(-1, 0)


async def test_out_of_memory_releases_the_pool_before_it_is_raised() -> None:
    quota = 256 * KiB
    with spawn.daemon("webgpu", extra_args=("--session-memory-bytes", str(quota))) as (address, _proc):
        async with gpud_client.connect(address) as gpu:
            x = gpu.tensor(np.ones(8 * KiB, np.float32))  # 32 KiB
            for s in (1, 2, 4, 8):  # 4 keys: 128 KiB pooled, 160 KiB in use
                gpu.ops.scale(x.reshape(s, -1), 1.0).free()
            await gpu.sync()
            assert gpu.pool_stats()["entries"] == 4
            gpu.empty(32 * KiB, "float32")  # 128 KiB: refused, for what the pool holds
            with pytest.raises(OutOfMemory):
                await gpu.sync()
            assert gpu.pool_stats()["entries"] == 0  # released before the error was raised
            retry = gpu.empty(32 * KiB, "float32")  # the same, again: the pool's frees went first
            await gpu.sync()
            assert (await gpu.stats())["session"]["private_bytes"] == 160 * KiB
            retry.free()

            a, b = gpu.tensor(np.ones((512, 1), np.float32)), gpu.tensor(np.ones((1, 512), np.float32))
            gpu.ops.add(a, a).free()  # the kernel registered (a request of its own would be answered with the OOM)
            await gpu.sync()
            gpu.trim()
            refused = gpu.ops.add(a, b)  # a 1 MiB output: its allocation is refused
            refused.free()  # pooled before the client hears of it
            frees = gpu.pool_stats()["frees"]
            with pytest.raises(OutOfMemory):
                await gpu.sync()
            assert refused.handle not in gpu._pool and gpu.pool_stats()["frees"] == frees  # dropped, no Free
            with pytest.raises(NotFound):  # the add's dispatch, on a handle that never was: reported once
                await gpu.sync()
            for _ in range(3):
                assert gpu.ops.add(a.reshape(1, 512), b).handle != refused.handle
            await gpu.sync()  # nothing else failed (no Free of the refused handle)


async def test_an_eager_forward_allocates_on_its_first_run_only(gpu: gpud_client.Client) -> None:
    """The tiny random BERT's eager forward: the same results with and without the pool; with it, from the
    second forward on, no Alloc or Free at all (the three inputs' uploads reuse pooled handles too), and
    no new handle."""
    config = CONFIGS["tiny"]
    weights = {name: gpu.tensor(a) for name, a in random_weights(config, 1).items()}
    encoder = Encoder(gpu, config, weights)
    ids, mask = np.array([[5, 6, 7, 0], [8, 9, 0, 0]]), np.array([[1, 1, 1, 0], [1, 1, 0, 0]])
    gpu.set_pool_limits(0, 0)
    first = sent(gpu)
    unpooled = [await encoder.embed(ids, mask) for _ in range(2)]
    per_forward = (sent(gpu)[0] - first[0]) // 2
    assert per_forward > 3 + 2 * config.layers  # every output allocated, every forward
    gpu.set_pool_limits(POOL_BYTES, POOL_ENTRIES)
    pooled = [await encoder.embed(ids, mask)]
    await gpu.sync()
    before, stats, handles = sent(gpu), gpu.pool_stats(), (await gpu.stats())["session"]["handles"]
    pooled += [await encoder.embed(ids, mask) for _ in range(3)]
    after = gpu.pool_stats()
    assert (after["allocs"] - before[0], after["frees"] - before[1]) == (0, 0)
    assert after["misses"] == stats["misses"] and after["hits"] - stats["hits"] == 3 * per_forward
    assert (await gpu.stats())["session"]["handles"] == handles
    for got in [*unpooled[1:], *pooled]:
        np.testing.assert_array_equal(got, unpooled[0])
    encoder.free()


def test_the_pool_takes_a_quarter_of_the_memory_quota() -> None:
    """The welcome says the session's quota; the pool holds a quarter of it, never under 1 GiB (and
    1 GiB where the daemon says none: 0 or absent)."""
    from gpud_client.pool import POOL_BYTES, default_bytes

    assert default_bytes(8 << 30) == 2 << 30
    assert default_bytes(1 << 30) == POOL_BYTES == 1 << 30
    assert default_bytes(0) == default_bytes(None) == default_bytes("8") == POOL_BYTES


async def test_the_daemon_tells_the_quota(gpu: gpud_client.Client) -> None:
    from gpud_client.pool import default_bytes

    quota = gpu.welcome["memory_quota"]
    assert isinstance(quota, int) and quota > 0
    assert gpu._pool.max_bytes == default_bytes(quota)

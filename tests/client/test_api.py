"""Integration tests: the async client against a real daemon, on every available backend."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import anyio
import numpy as np
import pytest
from support import (
    BAD_ENTRY,
    BAD_SOURCE,
    BAD_SYMBOL,
    Daemon,
    add,
    assert_close,
    axpb,
    device_memory,
    last_seq,
    ref_axpb,
    run_add,
    run_axpb,
    scale,
    wait_for_memory,
)

import gpud_client
import gpud_protocol
from gpud.testing import spawn
from gpud.testing import workloads as kernels
from gpud_client import (
    AlreadyExists,
    CompileError,
    DaemonLost,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    u32,
)

Client = gpud_client.Client


def _name(prefix: str) -> str:
    return f"test/{prefix}-{uuid.uuid4().hex[:12]}"


# --------------------------------------------------------------------------- the basic flow


async def test_readme_example_flow(gpu: Client) -> None:
    k = await scale(gpu)
    x = gpu.tensor(np.arange(1024, dtype=np.float32))
    y = gpu.empty((1024,), "float32")
    gpu.dispatch(k, grid=(1024 // 64, 1, 1), args=[x, y, 2.0])
    out = await y.numpy()
    await gpu.sync()
    y.free()
    x.free()
    np.testing.assert_array_equal(out, np.arange(1024, dtype=np.float32) * 2)
    assert gpu.backend in ("webgpu", "cuda")
    assert gpu.session_id


async def test_welcome_describes_the_daemon(gpu: Client, daemon: Daemon) -> None:
    assert gpu.backend == daemon.backend
    assert gpu.welcome["v"] == gpud_protocol.PROTOCOL_VERSION
    assert gpu.welcome["devices"] and gpu.welcome["devices"][0]["backend"] == daemon.backend
    assert gpu.limits.max_ops_per_batch > 0


async def test_chained_random_axpb_matches_numpy(gpu: Client) -> None:
    """Several steps of 300 dependent dispatches with random a, b, each checked against numpy."""
    k = await axpb(gpu)
    rng = np.random.default_rng(1234)
    n, chain = 1000, 300
    for _step in range(3):
        x0 = rng.standard_normal(n).astype(np.float32)
        bufs = [gpu.tensor(x0), gpu.empty(n)]
        ref = x0
        for i in range(chain):
            a, b = float(rng.uniform(0.9, 1.1)), float(rng.uniform(-0.5, 0.5))
            run_axpb(gpu, k, bufs[i % 2], bufs[(i + 1) % 2], a, b)
            ref = ref_axpb(ref, a, b)
        out = await bufs[chain % 2].numpy()
        assert_close(out, ref)
        for t in bufs:
            t.free()


async def test_many_small_requests_interleaved(gpu: Client) -> None:
    """Dispatches and readbacks interleaved one by one (a flush per readback), all in order."""
    k = await axpb(gpu)
    rng = np.random.default_rng(5)
    x = rng.standard_normal(77).astype(np.float32)
    t = gpu.tensor(x)
    y = gpu.empty(77)
    for i in range(40):
        run_axpb(gpu, k, t, y, 1.0 + i / 100, float(i))
        x_ref = ref_axpb(x, 1.0 + i / 100, float(i))
        assert_close(await y.numpy(), x_ref)
        gpu.copy(y, t)
        x = x_ref
    assert_close(await t.numpy(), x)


async def test_two_inputs_and_copy(gpu: Client) -> None:
    k = await add(gpu)
    rng = np.random.default_rng(2)
    x, y = rng.standard_normal(500).astype(np.float32), rng.standard_normal(500).astype(np.float32)
    tx, ty, tz, tw = gpu.tensor(x), gpu.tensor(y), gpu.empty(500), gpu.empty(500)
    run_add(gpu, k, tx, ty, tz)
    gpu.copy(tz, tw)  # the copy sees the dispatch before it
    run_add(gpu, k, tw, tz, tx)  # x := 2 (x + y)
    assert_close(await tw.numpy(), x + y)
    assert_close(await tx.numpy(), 2 * (x + y))


# --------------------------------------------------------------------------- ordering


async def test_upload_after_dispatch_does_not_overtake_it(gpu: Client) -> None:
    """dispatch reads x, then x.upload(new): the dispatch must see the old data (ordering rule 1)."""
    k = await axpb(gpu)
    old = np.arange(300, dtype=np.float32)
    new = np.full(300, -7.0, dtype=np.float32)
    x, y = gpu.tensor(old), gpu.empty(300)
    run_axpb(gpu, k, x, y, 2.0, 1.0)
    x.upload(new)  # same batch as the dispatch, not yet submitted
    assert_close(await y.numpy(), ref_axpb(old, 2.0, 1.0))
    np.testing.assert_array_equal(await x.numpy(), new)


async def test_upload_dispatch_upload_dispatch_in_one_batch(gpu: Client) -> None:
    k = await axpb(gpu)
    v1 = np.linspace(-1, 1, 129, dtype=np.float32)
    v2 = np.linspace(5, 6, 129, dtype=np.float32)
    x, y1, y2 = gpu.empty(129), gpu.empty(129), gpu.empty(129)
    x.upload(v1)
    run_axpb(gpu, k, x, y1, 3.0, 0.0)
    x.upload(v2)
    run_axpb(gpu, k, x, y2, 3.0, 0.0)
    x.upload(v1)
    r1, r2, rx = await y1.numpy(), await y2.numpy(), await x.numpy()
    assert_close(r1, ref_axpb(v1, 3.0, 0.0))
    assert_close(r2, ref_axpb(v2, 3.0, 0.0))
    np.testing.assert_array_equal(rx, v1)


async def test_array_changed_after_upload_call_is_not_seen(gpu: Client) -> None:
    host = np.arange(64, dtype=np.float32)
    t = gpu.tensor(host)  # the copy is taken at the call
    host[:] = -1
    t2 = gpu.empty(64)
    t2.upload(host)
    host[:] = 99
    np.testing.assert_array_equal(await t.numpy(), np.arange(64, dtype=np.float32))
    np.testing.assert_array_equal(await t2.numpy(), np.full(64, -1, dtype=np.float32))


async def test_dispatch_after_readback_does_not_overtake_it(gpu: Client) -> None:
    """A readback in flight, then a dispatch writing the same tensor: the readback sees the old data."""
    k = await axpb(gpu)
    old = np.arange(256, dtype=np.float32)
    src = gpu.tensor(np.ones(256, dtype=np.float32))
    y = gpu.tensor(old)
    await gpu.sync()
    first = asyncio.ensure_future(y.numpy())
    await asyncio.sleep(0)  # the readback request is on its way; the dispatch follows it
    run_axpb(gpu, k, src, y, 0.0, 42.0)
    second = await y.numpy()
    np.testing.assert_array_equal(await first, old)
    np.testing.assert_array_equal(second, np.full(256, 42.0, dtype=np.float32))


async def test_read_after_write_across_flushes(gpu: Client) -> None:
    """A chain split by sync(), flush() and intermediate readbacks still sees every write."""
    k = await axpb(gpu)
    x0 = np.random.default_rng(9).standard_normal(333).astype(np.float32)
    bufs = [gpu.tensor(x0), gpu.empty(333)]
    ref = x0
    for i in range(60):
        run_axpb(gpu, k, bufs[i % 2], bufs[(i + 1) % 2], 1.01, 0.01 * (i % 7))
        ref = ref_axpb(ref, 1.01, 0.01 * (i % 7))
        if i == 14:
            await gpu.sync()
        elif i == 29:
            await gpu.flush()
        elif i == 44:
            assert_close(await bufs[(i + 1) % 2].numpy(), ref)
    assert_close(await bufs[60 % 2].numpy(), ref)


async def test_sync_waits_for_the_work(gpu: Client) -> None:
    k = await axpb(gpu)
    x = gpu.tensor(np.ones(4096, dtype=np.float32))
    y = gpu.empty(4096)
    for _ in range(20):
        run_axpb(gpu, k, x, y, 2.0, 0.0)
        run_axpb(gpu, k, y, x, 1.0, 0.0)
    await gpu.sync()
    stats = (await gpu.stats())["device"]
    assert stats["completed"] == stats["submitted"]
    np.testing.assert_array_equal(await x.numpy(), np.full(4096, 2.0**20, dtype=np.float32))


# --------------------------------------------------------------------------- sizes and dtypes


@pytest.mark.parametrize("size", [1, 3, 7, 1001])
async def test_odd_sized_uint8_round_trip(gpu: Client, size: int) -> None:
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
    t = gpu.tensor(data)
    neighbour = gpu.tensor(np.full(8, 0xAB, dtype=np.uint8))
    out = await t.numpy()
    assert out.dtype == np.uint8 and out.shape == (size,)
    np.testing.assert_array_equal(out, data)
    # Overwrite in place with another odd-sized payload; nothing spills into other tensors.
    data2 = data[::-1].copy()
    t.upload(data2)
    np.testing.assert_array_equal(await t.numpy(), data2)
    np.testing.assert_array_equal(await neighbour.numpy(), np.full(8, 0xAB, dtype=np.uint8))


@pytest.mark.parametrize("n", [1, 5, 1001])
async def test_odd_length_float16_round_trip(gpu: Client, n: int) -> None:
    data = np.random.default_rng(n).standard_normal(n).astype(np.float16)
    t = gpu.tensor(data)
    out = await t.numpy()
    assert out.dtype == np.float16
    np.testing.assert_array_equal(out, data)


async def test_zero_element_tensor(gpu: Client) -> None:
    t = gpu.tensor(np.zeros(0, dtype=np.float32))
    out = await t.numpy()
    assert out.shape == (0,) and out.dtype == np.float32
    e = gpu.empty((3, 0, 2), "int16")
    assert (await e.numpy()).shape == (3, 0, 2)
    t2 = gpu.empty(0)
    gpu.copy(t, t2)
    assert (await t2.numpy()).shape == (0,)
    k = await axpb(gpu)
    run_axpb(gpu, k, t, t2, 1.0, 1.0)  # grid 0: nothing to do, nothing fails
    assert (await t2.numpy()).shape == (0,)
    t.free()
    e.free()
    t2.free()
    await gpu.sync()


@pytest.mark.parametrize(
    ("dtype", "shape"),
    [
        ("float64", (3, 5, 7)),
        ("int64", (2, 3)),
        ("uint64", (5,)),
        ("int8", (2, 2, 2, 3)),
        ("int16", (9,)),
        ("uint16", (1, 1, 1, 1, 1, 1, 1, 3)),
        ("int32", (17,)),
        ("uint32", (4, 4)),
        ("float32", ()),
    ],
)
async def test_dtypes_and_shapes_round_trip(gpu: Client, dtype: str, shape: tuple[int, ...]) -> None:
    info = np.iinfo(dtype) if np.dtype(dtype).kind in "iu" else None
    rng = np.random.default_rng(0)
    if info is not None:
        data = rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    else:
        data = rng.standard_normal(shape).astype(dtype)
    out = await gpu.tensor(data).numpy()
    assert out.dtype == np.dtype(dtype) and out.shape == shape
    np.testing.assert_array_equal(out, data)


async def test_large_tensor_round_trip(gpu: Client) -> None:
    """48 MiB (plus a few odd bytes) goes up and down in chunks, and through a device copy."""
    n = (48 << 20) // 4
    data = np.random.default_rng(48).standard_normal(n).astype(np.float32)
    t = gpu.tensor(data)
    copy = gpu.empty(n)
    gpu.copy(t, copy)
    np.testing.assert_array_equal(await t.numpy(), data)
    np.testing.assert_array_equal(await copy.numpy(), data)
    t.free()
    copy.free()
    odd = np.random.default_rng(49).integers(0, 256, (17 << 20) + 3, dtype=np.uint8)
    t = gpu.tensor(odd)
    np.testing.assert_array_equal(await t.numpy(), odd)
    t.free()
    await gpu.sync()


# --------------------------------------------------------------------------- concurrency


async def _own_chain(address: str, seed: int, results: dict[int, bool]) -> None:
    async with gpud_client.connect(address) as gpu:
        k = await axpb(gpu)
        rng = np.random.default_rng(seed)
        for _step in range(3):
            x0 = rng.standard_normal(2000).astype(np.float32)
            bufs = [gpu.tensor(x0), gpu.empty(2000)]
            ref = x0
            for i in range(50):
                a, b = float(rng.uniform(0.9, 1.1)), float(rng.uniform(-1, 1))
                run_axpb(gpu, k, bufs[i % 2], bufs[(i + 1) % 2], a, b)
                ref = ref_axpb(ref, a, b)
                if i % 17 == 16:
                    await anyio.sleep(0)  # let the other client interleave
            assert_close(await bufs[50 % 2].numpy(), ref)
            for t in bufs:
                t.free()
        results[seed] = True


async def test_two_concurrent_clients(address: str) -> None:
    results: dict[int, bool] = {}
    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            for seed in (1, 2, 3):
                tg.start_soon(_own_chain, address, seed, results)
    assert results == {1: True, 2: True, 3: True}


async def test_concurrent_requests_in_one_client(gpu: Client) -> None:
    """Many readbacks in flight at once: each resolves with its own tensor's data."""
    arrays = [np.full(10 + i, i, dtype=np.int32) for i in range(50)]
    tensors = [gpu.tensor(a) for a in arrays]
    outs = await asyncio.gather(*(t.numpy() for t in tensors))
    for a, out in zip(arrays, outs, strict=True):
        np.testing.assert_array_equal(out, a)


async def test_cancelled_await_does_not_lose_another_reply(gpu: Client) -> None:
    a = gpu.tensor(np.full(1000, 1.0, dtype=np.float32))
    b = gpu.tensor(np.full(1000, 2.0, dtype=np.float32))
    for _ in range(5):
        with anyio.move_on_after(0.00001):
            await a.numpy()
        np.testing.assert_array_equal(await b.numpy(), np.full(1000, 2.0, dtype=np.float32))
    # Cancel one of two readbacks in flight: the other still gets its own reply.
    first = asyncio.ensure_future(a.numpy())
    second = asyncio.ensure_future(b.numpy())
    await asyncio.sleep(0)
    first.cancel()
    np.testing.assert_array_equal(await second, np.full(1000, 2.0, dtype=np.float32))
    with pytest.raises(asyncio.CancelledError):
        await first
    # A cancelled sync and a cancelled kernel registration don't derail later requests either.
    with anyio.move_on_after(0.00001):
        await gpu.sync()
    with anyio.move_on_after(0.00001):
        await axpb(gpu)
    k = await axpb(gpu)
    y = gpu.empty(1000)
    run_axpb(gpu, k, a, y, 3.0, 0.5)
    np.testing.assert_array_equal(await y.numpy(), np.full(1000, 3.5, dtype=np.float32))
    assert not gpu._connection._futures  # nothing left behind by the cancelled awaits


async def test_dynamic_shared_memory_is_cudas(gpu: Client) -> None:
    """`shared` reaches the daemon: CUDA gives the block that much extern __shared__ memory (past 48 KB
    here); WGSL declares workgroup memory in the source, so WebGPU refuses it by name."""
    source, options = kernels.axpb_source(gpu.backend)
    if gpu.backend != "cuda":
        with pytest.raises(InvalidArgument, match="not with 'shared'"):
            await gpu.kernel(source, "axpb", shared=4096, **options)  # type: ignore[arg-type]
        return
    reverse = (
        'extern "C" __global__ void reverse(const float* x, float* y) {\n'
        "    extern __shared__ float s[];\n"
        "    const unsigned int n = blockDim.x * 64;\n"
        "    for (unsigned int i = threadIdx.x; i < n; i += blockDim.x) s[i] = x[i];\n"
        "    __syncthreads();\n"
        "    for (unsigned int i = threadIdx.x; i < n; i += blockDim.x) y[i] = s[n - 1 - i];\n"
        "}\n"
    )
    k = await gpu.kernel(reverse, "reverse", block=(256, 1, 1), writes=[1], shared=256 * 64 * 4)
    x = np.random.default_rng(0).standard_normal(256 * 64).astype(np.float32)
    tx, ty = gpu.tensor(x), gpu.empty(x.shape, "float32")
    gpu.dispatch(k, (1, 1, 1), [tx, ty])
    np.testing.assert_array_equal(await ty.numpy(), x[::-1])


# --------------------------------------------------------------------------- typed errors


async def test_compile_error_carries_the_log(gpu: Client) -> None:
    with pytest.raises(CompileError) as info:
        await gpu.kernel(BAD_SOURCE[gpu.backend], BAD_ENTRY, block=(64, 1, 1) if gpu.backend == "cuda" else None)
    exc = info.value
    assert BAD_SYMBOL in exc.message
    assert exc.op == "kernel" and isinstance(exc.seq, int)
    # The session goes on: the error was seen, so it is not sticky any more.
    t = gpu.tensor(np.arange(5, dtype=np.float32))
    np.testing.assert_array_equal(await t.numpy(), np.arange(5, dtype=np.float32))
    k = await axpb(gpu)
    assert k.handle > 0


async def test_wrong_argument_count_is_invalid_argument(gpu: Client) -> None:
    k = await axpb(gpu)
    x = gpu.tensor(np.ones(64, dtype=np.float32))
    y = gpu.empty(64)
    gpu.dispatch(k, 1, [x, y])
    bad_seq = last_seq(gpu)
    with pytest.raises(InvalidArgument) as info:
        await y.numpy()
    assert info.value.op == "dispatch" and info.value.seq == bad_seq
    # sticky until seen, then acknowledged: the next readback works
    np.testing.assert_array_equal(await x.numpy(), np.ones(64, dtype=np.float32))


async def test_arguments_that_do_not_match_the_bindings(gpu: Client) -> None:
    k = await axpb(gpu)
    x = gpu.tensor(np.ones(64, dtype=np.float32))
    gpu.dispatch(k, 1, [x, 1.0, 2.0, 3.0, u32(64)])  # a scalar where a tensor belongs
    bad_seq = last_seq(gpu)
    with pytest.raises(InvalidArgument) as info:
        await gpu.sync()
    assert info.value.op == "dispatch" and info.value.seq == bad_seq
    await gpu.sync()


async def test_grid_beyond_the_device_limit(gpu: Client) -> None:
    k = await axpb(gpu)
    x, y = gpu.tensor(np.ones(64, dtype=np.float32)), gpu.empty(64)
    gpu.dispatch(k, (1, 1 << 20, 1), [x, y, 1.0, 0.0, u32(64)])
    bad_seq = last_seq(gpu)
    with pytest.raises(InvalidArgument) as info:
        await y.numpy()
    assert info.value.op == "dispatch" and info.value.seq == bad_seq
    assert "grid" in info.value.message
    run_axpb(gpu, k, x, y, 1.0, 1.0)
    np.testing.assert_array_equal(await y.numpy(), np.full(64, 2.0, dtype=np.float32))


async def test_unknown_and_freed_handles_are_not_found(gpu: Client) -> None:
    good = gpu.tensor(np.arange(8, dtype=np.float32))
    ghost = gpud_client.Tensor(gpu, 1_000_000, np.dtype("float32"), (8,), 0)
    with pytest.raises(NotFound) as info:
        await ghost.numpy()
    assert info.value.op == "readback"
    np.testing.assert_array_equal(await good.numpy(), np.arange(8, dtype=np.float32))

    gone = gpu.empty(8)  # not an upload or an op output: freeing it frees it at once (not pooled)
    gone.free()
    with pytest.raises(InvalidArgument):  # the client knows it freed it
        await gone.numpy()
    same_handle = gpud_client.Tensor(gpu, gone.handle, gone.dtype, gone.shape, 0)
    with pytest.raises(NotFound):  # and so does the daemon
        await same_handle.numpy()

    k = await axpb(gpu)
    y = gpu.empty(8)
    gpu.dispatch(k, 1, [same_handle, y, 1.0, 0.0, u32(8)])
    bad_seq = last_seq(gpu)
    with pytest.raises(NotFound) as info:
        await y.numpy()
    assert info.value.op == "dispatch" and info.value.seq == bad_seq

    gpu.dispatch(gpud_client.Kernel(999_999, "nope", None), 1, [good, y])
    with pytest.raises(NotFound) as info:
        await gpu.sync()
    assert "kernel" in info.value.message

    same_handle.free()  # a free of an unknown handle is an error too
    with pytest.raises(NotFound) as info:
        await gpu.sync()
    assert info.value.op == "free"
    np.testing.assert_array_equal(await good.numpy(), np.arange(8, dtype=np.float32))


async def test_sticky_error_fails_every_request_until_seen(gpu: Client) -> None:
    """The first failure is reported on the next reply; requests already in flight get it too."""
    x = gpu.tensor(np.ones(16, dtype=np.float32))
    ghost = gpud_client.Tensor(gpu, 2_000_000, np.dtype("float32"), (16,), 0)
    gpu.copy(ghost, x)  # fails: no reply of its own
    bad_seq = last_seq(gpu)
    results = await asyncio.gather(x.numpy(), gpu.sync(), x.numpy(), return_exceptions=True)
    for result in results:
        assert isinstance(result, NotFound), result
        assert result.seq == bad_seq and result.op == "copy"
    np.testing.assert_array_equal(await x.numpy(), np.ones(16, dtype=np.float32))


async def test_flush_and_open_report_the_sticky_error(gpu: Client) -> None:
    x = gpu.tensor(np.ones(4, dtype=np.float32))
    ghost = gpud_client.Tensor(gpu, 2_000_001, np.dtype("float32"), (4,), 0)
    gpu.copy(ghost, x)
    with pytest.raises(NotFound) as failed:
        await gpu.flush()
    assert failed.value.op == "copy"
    await gpu.flush()  # seen once: the session goes on
    gpu.copy(ghost, x)
    with pytest.raises(NotFound) as failed:
        await gpu.open(_name("nothing-here"))
    assert failed.value.op == "copy"  # the copy's error first, not the open's own
    np.testing.assert_array_equal(await x.numpy(), np.ones(4, dtype=np.float32))


async def test_daemon_error_with_nothing_waiting_reaches_the_next_request(gpu: Client) -> None:
    gpu._connection._send([b"\xc1 not msgpack"])  # the daemon answers with an unattributable protocol error
    await anyio.sleep(0.3)
    with pytest.raises(gpud_client.ProtocolError):
        await gpu.sync()
    await gpu.sync()


async def test_client_side_validation(gpu: Client) -> None:
    with pytest.raises(InvalidArgument):
        gpu.empty(4, "complex64")
    t = gpu.empty((2, 3), "float32")
    with pytest.raises(InvalidArgument):
        t.upload(np.zeros((3, 2), dtype=np.float32))
    with pytest.raises(InvalidArgument):
        t.upload(np.zeros((2, 3), dtype=np.float64))
    k = await axpb(gpu)
    with pytest.raises(InvalidArgument):
        gpu.dispatch(k, 1, [t, t, True])
    with pytest.raises(InvalidArgument):
        gpu.dispatch(k, 1, [t, t, "1.0"])
    with pytest.raises(InvalidArgument):
        gpu.dispatch(k, (1, 1, 1, 1), [t])
    await gpu.sync()  # nothing invalid reached the daemon


async def test_same_kernel_source_is_compiled_once(gpu: Client) -> None:
    before = (await gpu.stats())["device"].get("compiles", 0)
    k1 = await axpb(gpu)
    k2 = await axpb(gpu)
    after = (await gpu.stats())["device"].get("compiles", 0)
    assert k1 == k2  # the same kernel, without a second registration
    assert after - before <= 1  # the daemon's cache is shared by every session
    async with gpud_client.connect(gpu.address) as other:
        assert (await axpb(other)).handle >= 1
        assert (await other.stats())["device"].get("compiles", 0) == after


# --------------------------------------------------------------------------- the daemon going away


async def test_connect_to_a_missing_socket_raises_daemon_lost(tmp_path: Path) -> None:
    with anyio.fail_after(2), pytest.raises(DaemonLost):
        async with gpud_client.connect(f"ipc://{tmp_path}/nobody-here.sock"):
            pass


async def test_errors_leave_the_connect_block_unwrapped(address: str) -> None:
    """`except NotFound` around `async with connect()` works: no exception group in the way."""
    with pytest.raises(NotFound):
        async with gpud_client.connect(address) as gpu:
            await gpud_client.Tensor(gpu, 3_000_000, np.dtype("uint8"), (1,), 0).numpy()
    with pytest.raises(KeyError, match="mine"):
        async with gpud_client.connect(address):
            raise KeyError("mine")


async def test_connect_to_a_dead_socket_times_out_with_daemon_lost(tmp_path: Path) -> None:
    (tmp_path / "stale.sock").write_bytes(b"")
    with anyio.fail_after(5), pytest.raises(DaemonLost):
        async with gpud_client.connect(f"ipc://{tmp_path}/stale.sock", timeout=0.5):
            pass


async def test_daemon_killed_fails_pending_and_later_awaits(private_daemon: Daemon) -> None:
    async with gpud_client.connect(private_daemon.address) as gpu:
        t = gpu.tensor(np.arange(10, dtype=np.float32))
        np.testing.assert_array_equal(await t.numpy(), np.arange(10, dtype=np.float32))
        os.kill(private_daemon.proc.pid, signal.SIGSTOP)  # a readback that cannot be answered ...
        pending = asyncio.ensure_future(t.numpy())
        await asyncio.sleep(0.05)
        assert not pending.done()
        os.kill(private_daemon.proc.pid, signal.SIGKILL)  # ... then the daemon is gone
        with anyio.fail_after(10):
            with pytest.raises(DaemonLost):
                await pending
            with pytest.raises(DaemonLost):
                await t.numpy()
            with pytest.raises(DaemonLost):
                gpu.empty(4)
    private_daemon.proc.wait(timeout=10)
    # A new daemon on the same socket path (the old one left its socket file behind) serves again.
    with spawn.daemon("webgpu", address=private_daemon.address) as (address, _proc):
        async with gpud_client.connect(address) as gpu:
            t = gpu.tensor(np.arange(3, dtype=np.float32))
            np.testing.assert_array_equal(await t.numpy(), np.arange(3, dtype=np.float32))


async def test_daemon_that_stops_answering_is_lost(private_daemon: Daemon) -> None:
    """A frozen daemon (socket still open) is found by the heartbeat, not waited on forever."""
    async with gpud_client.connect(private_daemon.address) as gpu:
        t = gpu.tensor(np.arange(10, dtype=np.float32))
        await gpu.sync()
        os.kill(private_daemon.proc.pid, signal.SIGSTOP)
        try:
            with anyio.fail_after(15), pytest.raises(DaemonLost):
                await t.numpy()
        finally:
            os.kill(private_daemon.proc.pid, signal.SIGCONT)


def test_second_daemon_on_the_same_socket_refuses(daemon: Daemon) -> None:
    cmd = [sys.executable, "-m", "gpud", "serve", "--address", daemon.address, "--backend", "webgpu"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "already served" in result.stderr + result.stdout
    assert spawn.answers(daemon.address, timeout=5)  # the first one still serves its clients
    daemon.assert_alive()


# --------------------------------------------------------------------------- memory and residents


async def test_device_memory_back_to_baseline_after_sessions_close(address: str) -> None:
    baseline = await device_memory(address)
    async with gpud_client.connect(address) as one, gpud_client.connect(address) as two:
        k1, k2 = await axpb(one), await axpb(two)
        keep = [one.tensor(np.ones(10_000, dtype=np.float32)) for _ in range(4)]
        ys = [two.empty(5000) for _ in range(3)]
        x2 = two.tensor(np.ones(5000, dtype=np.float32))
        for y in ys:
            run_axpb(two, k2, x2, y, 2.0, 0.0)
        run_axpb(one, k1, keep[0], keep[1], 1.0, 1.0)
        await one.sync()
        await ys[0].numpy()
        during = (await two.stats())["device"]
        assert during["memory_in_use"] >= baseline["memory_in_use"] + 4 * 40_000 + 4 * 20_000
        keep[2].free()
        # Leave work queued and unflushed: closing must wait for it before freeing.
        for _ in range(10):
            run_axpb(one, k1, keep[0], keep[3], 1.5, 0.0)
            run_axpb(two, k2, x2, ys[1], 1.5, 0.0)
    await wait_for_memory(address, baseline)


async def test_resident_tensor_shared_between_sessions(address: str) -> None:
    name = _name("weights")
    baseline = await device_memory(address)
    data = np.random.default_rng(11).standard_normal(700).astype(np.float32)
    async with gpud_client.connect(address) as publisher:
        w = publisher.tensor(data)
        publisher.publish(w, name, "ro")
        await publisher.sync()
        async with gpud_client.connect(address) as reader:
            r = await reader.open(name)
            assert (r.mode, r.shape, r.dtype) == ("ro", (700,), np.dtype("float32"))
            np.testing.assert_array_equal(await r.numpy(), data)
            k = await axpb(reader)
            y = reader.empty(700)
            run_axpb(reader, k, r, y, 2.0, 1.0)  # only reads the resident: allowed
            assert_close(await y.numpy(), ref_axpb(data, 2.0, 1.0))

            run_axpb(reader, k, y, r, 2.0, 1.0)  # writes the read-only resident
            bad_seq = last_seq(reader)
            with pytest.raises(PermissionDenied) as info:
                await y.numpy()
            assert info.value.op == "dispatch" and info.value.seq == bad_seq

            r.upload(np.zeros(700, dtype=np.float32))
            with pytest.raises(PermissionDenied):
                await reader.sync()
            gpu_copy_target = r
            reader.copy(y, gpu_copy_target)
            with pytest.raises(PermissionDenied):
                await reader.sync()
            reader.publish(r, _name("again"), "rw")  # cannot widen the mode by republishing
            with pytest.raises(PermissionDenied):
                await reader.sync()
            np.testing.assert_array_equal(await r.numpy(), data)  # untouched by all that

            stats = await reader.stats()
            assert stats["residents"]["count"] >= 1
        # The publisher's own handle still writes it.
        w.upload(data * 2)
        await publisher.sync()
    # Both sessions are gone; the resident is not.
    async with gpud_client.connect(address) as later:
        r = await later.open(name)
        np.testing.assert_array_equal(await r.numpy(), data * 2)
        later.unpublish(name)
        r.free()
        await later.sync()
        with pytest.raises(NotFound):
            await later.open(name)
    await wait_for_memory(address, baseline)


async def test_read_write_resident(address: str) -> None:
    name = _name("cache")
    baseline = await device_memory(address)
    async with gpud_client.connect(address) as owner, gpud_client.connect(address) as writer:
        t = owner.tensor(np.zeros(128, dtype=np.float32))
        owner.publish(t, name, "rw")
        await owner.sync()
        shared = await writer.open(name)
        assert shared.mode == "rw"
        k = await axpb(writer)
        src = writer.tensor(np.arange(128, dtype=np.float32))
        run_axpb(writer, k, src, shared, 1.0, 100.0)
        await writer.sync()
        np.testing.assert_array_equal(await t.numpy(), np.arange(128, dtype=np.float32) + 100)
        shared.upload(np.full(128, 3.0, dtype=np.float32))
        await writer.sync()
        np.testing.assert_array_equal(await t.numpy(), np.full(128, 3.0, dtype=np.float32))
        owner.unpublish(name)
        await owner.sync()
    await wait_for_memory(address, baseline)


async def test_resident_name_errors(gpu: Client) -> None:
    name = _name("taken")
    a = gpu.tensor(np.ones(4, dtype=np.float32))
    b = gpu.tensor(np.ones(4, dtype=np.float32))
    gpu.publish(a, name)
    gpu.publish(b, name)
    with pytest.raises(AlreadyExists):
        await gpu.sync()
    gpu.publish(a, _name("second-name"))
    with pytest.raises(AlreadyExists):  # one tensor, one name
        await gpu.sync()
    with pytest.raises(NotFound):
        await gpu.open(_name("nobody"))
    gpu.unpublish(_name("nobody"))
    with pytest.raises(NotFound):
        await gpu.sync()
    gpu.unpublish(name)
    await gpu.sync()


async def test_many_ops_split_into_several_batches(gpu: Client) -> None:
    """More ops than one batch may hold: the client splits them, order kept."""
    k = await axpb(gpu)
    x = gpu.tensor(np.zeros(64, dtype=np.float32))
    y = gpu.empty(64)
    count = gpu.limits.max_ops_per_batch + 500
    for _ in range(count // 2):
        run_axpb(gpu, k, x, y, 1.0, 1.0)
        run_axpb(gpu, k, y, x, 1.0, 0.0)
    np.testing.assert_array_equal(await x.numpy(), np.full(64, count // 2, dtype=np.float32))
    assert kernels.groups(64) == 1


async def test_a_tensor_past_the_devices_largest_buffer_is_an_invalid_argument(gpu: Client) -> None:
    """WebGPU caps one buffer (2 GiB - 1 on lavapipe); past it wgpu's validation error used to come
    back as OutOfMemory."""
    if gpu.backend != "webgpu":
        pytest.skip("WebGPU's buffer cap")
    t = gpu.empty((1 << 30,), "float32")  # 4 GiB
    with pytest.raises(gpud_client.InvalidArgument, match="largest buffer"):
        await gpu.sync()
    assert t.shape == (1 << 30,)  # never allocated: nothing to free

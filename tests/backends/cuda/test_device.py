"""DeviceRuntime over a real CudaDevice, in process: no daemon. Needs cuda-python and an NVIDIA GPU.

Written like tests/runtime/test_runtime.py (which runs the same runtime over the fake backend):
`make` opens a runtime on device 0 with a fresh kernel cache, `drive` resumes an op that had to
wait, `read` downloads a buffer through the runtime's reply parts, `Owner` records lost work.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import os
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pytest

from gpud import ops
from gpud.backends import cuda_problem
from gpud.backends.base import Buffer, Program, SubmissionFailed
from gpud.backends.cuda import open_device
from gpud.runtime.runtime import DeviceRuntime, Prepared, Wait
from gpud_protocol import DEFAULT_LIMITS, ArgKind, KernelOptions, Limits
from gpud_protocol.errors import CompileError, DeviceLost, GpudError, InvalidArgument

pytest.importorskip("cuda.bindings.driver")  # CI has no cuda-python: the whole module is skipped there

PROBLEM = cuda_problem()
pytestmark = [pytest.mark.cuda, pytest.mark.skipif(PROBLEM is not None, reason=PROBLEM or "")]

SCALE = """
extern "C" __global__ void scale(const float* x, float* y, float a, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i];
}
"""
BLOCK = (256, 1, 1)
OPTIONS = KernelOptions(BLOCK, (), None)

# Holds the GPU for `ms` milliseconds of wall time (the global timer counts nanoseconds).
SPIN = """
extern "C" __global__ void spin(unsigned int ms) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        __nanosleep(100000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ms * 1000000ull);
}
"""

# Writes 4 TiB past its argument: an illegal address, which poisons the CUDA context (sticky).
BAD = 'extern "C" __global__ void bad(float* p) { *(volatile float*)(p + (1ull << 40)) = 1.0f; }'


@dataclasses.dataclass(frozen=True)
class Settings:
    """What DeviceRuntime reads, and what CudaDevice reads (service defaults unless a test says)."""

    cache_dir: Path
    max_dispatches_per_flush: int = 4096  # tests flush explicitly: a run of launches stays one run
    submission_target_s: float = 0.0  # nor is it paced by time
    pool_idle_release_s: float = 0.0
    flush_deadline_ms: float = 2.0
    max_submissions_in_flight: int = 16
    staging_pool_bytes: int = 256 << 20
    reuse_memory_bytes: int = 64 << 20
    kernel_cache_size: int = 256
    completion_spin_us: float = 50.0
    graph_cache_size: int = 32
    graph_min_launches: int = 16
    graph_pdl: bool = True
    bind_group_cache_size: int = 8192
    limits: Limits = DEFAULT_LIMITS


class Owner:
    def __init__(self) -> None:
        self.lost: list[GpudError] = []

    def work_lost(self, error: GpudError) -> None:
        self.lost.append(error)


Opened = tuple[DeviceRuntime, list[DeviceLost]]


class Make(Protocol):
    def __call__(self, **settings: Any) -> Opened: ...


def open_runtime(cache_dir: Path, **overrides: Any) -> Opened:
    """A DeviceRuntime over CUDA device 0 and the list its on_lost fills; call inside the running loop."""
    settings = Settings(cache_dir, **overrides)
    lost: list[DeviceLost] = []
    device = open_device(0, 0, asyncio.get_running_loop(), settings)
    rt = DeviceRuntime(device, settings, lambda _rt, error: lost.append(error), settings.limits.reply_part_bytes)
    return rt, lost


@pytest.fixture
async def make(tmp_path: Path) -> AsyncIterator[Make]:
    """Opens runtimes on one cache directory (tmp_path); closes whichever a failing test left open."""
    opened: list[DeviceRuntime] = []

    def opener(**settings: Any) -> Opened:
        rt, lost = open_runtime(tmp_path, **settings)
        opened.append(rt)
        return rt, lost

    yield opener
    for rt in opened:
        if not rt.closed:
            await rt.close()


async def drive(wait: Wait | None) -> None:
    while wait is not None:
        await wait.ready
        wait = wait.resume()


async def start_read(rt: DeviceRuntime, buffer: Buffer, owner: Owner) -> asyncio.Future[bytes]:
    """Encode a download of `buffer` (in op order, not flushed); the future resolves to its bytes."""
    parts: dict[int, bytes] = {}
    done: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
    count = rt.parts(buffer.nbytes)

    def deliver(part: int, data: Any, error: BaseException | None) -> None:
        if done.done():
            return
        if error is not None:
            done.set_exception(error)
            return
        parts[part] = bytes(data)
        if len(parts) == count:
            done.set_result(b"".join(parts[i] for i in range(count)))

    await drive(rt.download(buffer, deliver, owner))
    return done


async def read(rt: DeviceRuntime, buffer: Buffer, owner: Owner) -> bytes:
    reading = await start_read(rt, buffer, owner)
    rt.flush()
    return await reading


async def compiled(rt: DeviceRuntime, source: str, entry: str, options: KernelOptions = OPTIONS) -> Program:
    got = rt.program(source, entry, options)
    return await got if isinstance(got, asyncio.Future) else got


async def settled(rt: DeviceRuntime) -> None:
    """Everything encoded has completed and the frees queued on the submit worker have run."""
    await rt.synchronize()
    while not rt.submitter.idle:
        await asyncio.sleep(0.005)


def scale_args(x: Buffer, y: Buffer, a: float, n: int) -> list[Any]:
    return [x, y, (ArgKind.F32, a), (ArgKind.U32, n)]


def blocks(n: int) -> tuple[int, int, int]:
    return ((n + BLOCK[0] - 1) // BLOCK[0], 1, 1)


def floats(data: bytes) -> np.ndarray[Any, np.dtype[np.float32]]:
    return np.frombuffer(data, np.float32)


async def finish(rt: DeviceRuntime, lost: list[DeviceLost], buffers: list[Buffer]) -> None:
    """Release `buffers`, check that nothing leaked and the device is fine, and close."""
    assert not lost and rt.ledger.lost is None, lost
    for buffer in buffers:
        rt.release(buffer)
    await rt.synchronize()
    assert rt.memory_in_use == 0 and rt.live_buffers == 0, rt.stats()
    await rt.close()


class Ticker:
    """Counts how often the event loop ran it while something else was awaited."""

    def __init__(self, interval: float) -> None:
        self.ticks = 0
        self._interval = interval
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            self.ticks += 1

    async def stop(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


# ---------------------------------------------------------------------------- correctness


async def test_dependent_chain_matches_numpy(make: Make) -> None:
    rt, lost = make()
    owner = Owner()
    n = 1000
    x0 = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    bufs = [rt.alloc(n * 4) for _ in range(3)]
    program = await compiled(rt, SCALE, "scale")
    assert program.writes == frozenset({1})
    await drive(rt.upload(bufs[0], memoryview(x0.tobytes()), owner))
    expect = x0.copy()
    for i in range(200):
        a = 1.01 if i % 2 else 0.995
        rt.dispatch(rt.prepare(program, blocks(n), scale_args(bufs[i % 2], bufs[(i + 1) % 2], a, n)), owner)
        expect = expect * np.float32(a)
    rt.copy(bufs[0], bufs[2], owner)  # 200 is even: the chain ends in bufs[0]
    assert rt.dispatches_pending == 200 and rt.ledger.submitted == 0  # nothing submitted yet
    got = floats(await read(rt, bufs[2], owner))
    np.testing.assert_allclose(got, expect, rtol=1e-6)
    assert rt.dispatch_count == 200 and rt.stats()["dispatches"] == 200
    assert rt.counters["flushes"] == 1
    assert not owner.lost
    await finish(rt, lost, bufs)


async def test_odd_and_empty_sizes_round_trip(make: Make) -> None:
    rt, lost = make()
    owner = Owner()
    for size in (0, 1, 7, 4097, 65537):
        data = os.urandom(size)
        buffer = rt.alloc(size)
        await drive(rt.upload(buffer, memoryview(data), owner))
        assert await read(rt, buffer, owner) == data, f"{size} bytes"
        rt.release(buffer)
    await finish(rt, lost, [])


async def test_large_transfers_are_chunked(make: Make) -> None:
    rt, lost = make(staging_pool_bytes=16 << 20)  # 8 MiB per direction: 2 MiB chunks and reply parts
    owner = Owner()
    data = os.urandom(40 << 20)
    assert rt.chunk_bytes < len(data) and rt.parts(len(data)) == len(data) // rt.part_bytes > 1
    buffer = rt.alloc(len(data))
    await drive(rt.upload(buffer, memoryview(data), owner))
    assert await read(rt, buffer, owner) == data
    stats = rt.stats()
    assert stats["upload_bytes"] == stats["download_bytes"] == len(data)
    assert stats["upload_staging"]["bytes"] <= 8 << 20 and stats["download_staging"]["bytes"] <= 8 << 20
    assert stats["upload_staging"]["exhausted_waits"] > 0  # the pool bound held: it waited for staging
    await finish(rt, lost, [buffer])


async def test_upload_keeps_its_place_in_op_order(make: Make) -> None:
    rt, lost = make()
    owner = Owner()
    n = 4096
    x, y = rt.alloc(n * 4), rt.alloc(n * 4)
    program = await compiled(rt, SCALE, "scale")
    ones, twos = np.ones(n, np.float32), np.full(n, 2, np.float32)
    await drive(rt.upload(x, memoryview(ones.tobytes()), owner))
    rt.dispatch(rt.prepare(program, blocks(n), scale_args(x, y, 3.0, n)), owner)  # reads the ones
    await drive(rt.upload(x, memoryview(twos.tobytes()), owner))  # must not overtake the dispatch
    first = await start_read(rt, y, owner)
    rt.dispatch(rt.prepare(program, blocks(n), scale_args(x, y, 3.0, n)), owner)
    second = await start_read(rt, y, owner)
    assert rt.ledger.submitted == 0  # all of it in one submission
    rt.flush()
    assert np.all(floats(await first) == 3.0)
    assert np.all(floats(await second) == 6.0)
    await finish(rt, lost, [x, y])


async def test_new_tensors_are_zero_filled(make: Make) -> None:
    rt, lost = make()
    owner = Owner()
    fresh = [rt.alloc(size) for size in (1, 4097, 1 << 20)]
    for buffer in fresh:
        assert await read(rt, buffer, owner) == bytes(buffer.nbytes), f"a new tensor of {buffer.nbytes} bytes"
    size = 1 << 20
    pattern = b"\xab" * size
    dirty = rt.alloc(size)
    await drive(rt.upload(dirty, memoryview(pattern), owner))
    assert await read(rt, dirty, owner) == pattern
    # In the same submission as work on another tensor.
    await drive(rt.upload(dirty, memoryview(pattern), owner))
    beside = rt.alloc(size)
    assert await read(rt, beside, owner) == bytes(size)
    # After a free of the same size (cuMemFree has run): the allocator may hand the same memory back.
    rt.release(dirty)
    await settled(rt)
    again = rt.alloc(size)
    assert rt.stats()["reused_memory"]["hits"] == 1, "the freed memory was handed back"
    assert await read(rt, again, owner) == bytes(size), "a re-allocated tensor kept the old contents"
    await finish(rt, lost, [*fresh, beside, again])


async def test_staging_pool_exhaustion_stays_correct(make: Make) -> None:
    rt, lost = make(staging_pool_bytes=64 << 10)  # 32 KiB per direction: 8 KiB chunks, 4 at a time
    owner = Owner()
    payloads = [os.urandom(16 << 10) for _ in range(32)]
    bufs = [rt.alloc(len(p)) for p in payloads]
    for buffer, payload in zip(bufs, payloads, strict=True):
        await drive(rt.upload(buffer, memoryview(payload), owner))
    readings = [await start_read(rt, buffer, owner) for buffer in bufs]
    rt.flush()
    assert [await r for r in readings] == payloads
    stats = rt.stats()
    assert stats["upload_staging"]["exhausted_waits"] > 0
    assert stats["download_staging"]["exhausted_waits"] > 0
    assert stats["upload_staging"]["bytes"] <= 32 << 10
    assert stats["download_staging"]["bytes"] <= 32 << 10
    await finish(rt, lost, bufs)


async def test_memory_is_returned(make: Make) -> None:
    rt, lost = make(reuse_memory_bytes=0)
    await settled(rt)
    free_before = rt.info()["memory_free"]
    bufs = [rt.alloc(64 << 20) for _ in range(4)]
    assert rt.memory_in_use == 256 << 20 and rt.live_buffers == 4
    assert rt.info()["memory_free"] <= free_before - (256 << 20)
    for buffer in bufs:
        rt.release(buffer)
    await settled(rt)
    assert rt.memory_in_use == 0 and rt.live_buffers == 0
    assert rt.info()["memory_free"] >= free_before - (8 << 20), "device memory was not given back"
    info = rt.info()
    assert info["backend"] == "cuda" and info["name"] and info["memory_bytes"] > 0
    assert info["compute_capability"].count(".") == 1
    assert info["memory_total"] >= info["memory_free"] > 0
    await finish(rt, lost, [])


async def test_freed_memory_kept_for_reuse_is_bounded(make: Make) -> None:
    rt, lost = make(reuse_memory_bytes=96 << 20)
    await settled(rt)
    free_before = rt.info()["memory_free"]
    for buffer in [rt.alloc(32 << 20) for _ in range(6)]:
        rt.release(buffer)
    await settled(rt)
    assert rt.memory_in_use == 0 and rt.stats()["reused_memory"]["bytes"] == 96 << 20
    assert rt.info()["memory_free"] >= free_before - (96 << 20) - (8 << 20), "more than the bound was kept"
    again = [rt.alloc(32 << 20) for _ in range(4)]  # three kept, one new
    assert rt.stats()["reused_memory"]["hits"] == 3
    await finish(rt, lost, again)


async def test_the_loop_keeps_running_while_the_gpu_works(make: Make) -> None:
    rt, lost = make()
    program = await compiled(rt, SPIN, "spin", KernelOptions((1, 1, 1), (), None))
    ticker = Ticker(0.01)
    try:
        started = time.perf_counter()
        rt.dispatch(rt.prepare(program, (1, 1, 1), [(ArgKind.U32, 400)]), Owner())
        await rt.synchronize()
        elapsed = time.perf_counter() - started
    finally:
        await ticker.stop()
    assert elapsed >= 0.35, f"the spin kernel took {elapsed:.3f} s, not 0.4 s"
    assert ticker.ticks >= 10, f"the event loop was blocked: {ticker.ticks} ticks during {elapsed:.3f} s of GPU work"
    await finish(rt, lost, [])


async def test_a_refused_submission_fails_only_its_waiters(make: Make) -> None:
    """A command the driver refuses (not a sticky error) fails its own submission; the device goes on."""
    rt, lost = make()
    owner, bystander = Owner(), Owner()
    n = 256
    x, y = rt.alloc(n * 4), rt.alloc(n * 4)
    program = await compiled(rt, SCALE, "scale")
    await drive(rt.upload(x, memoryview(np.ones(n, np.float32).tobytes()), bystander))
    await rt.synchronize()  # the zero fills and the upload are done and fine
    good = rt.prepare(program, blocks(n), scale_args(x, y, 3.0, n))
    module_id, function, gx, gy, gz, _bx, _by, _bz, shared, params = good.packed
    # 2048 threads per block: cuLaunchKernel refuses it at once (CUDA_ERROR_INVALID_VALUE), like a
    # check the daemon missed before encoding.
    bad = Prepared(good.buffers, (module_id, function, gx, gy, gz, 2048, 1, 1, shared, params))
    rt.dispatch(bad, owner)
    reading = await start_read(rt, y, owner)
    failed = rt.synchronize()
    with pytest.raises(SubmissionFailed):
        await failed
    with pytest.raises(SubmissionFailed):
        await reading
    assert len(owner.lost) == 1 and isinstance(owner.lost[0], SubmissionFailed), owner.lost
    assert not bystander.lost
    assert not lost and rt.ledger.lost is None, "a refused launch must not lose the device"
    assert rt.stats()["failed_submissions"] == 1
    rt.dispatch(good, bystander)  # the next submission runs
    assert np.all(floats(await read(rt, y, bystander)) == 3.0)
    assert not bystander.lost and len(owner.lost) == 1
    await finish(rt, lost, [x, y])


# ---------------------------------------------------------------------------- kernels


async def test_compiles_run_on_the_compile_worker(make: Make, monkeypatch: pytest.MonkeyPatch) -> None:
    rt, lost = make()
    threads: list[str] = []
    real_compile = rt.device.compile

    def compile_spy(*args: Any) -> Program:
        threads.append(threading.current_thread().name)
        return real_compile(*args)

    monkeypatch.setattr(rt.device, "compile", compile_spy)
    ticker = Ticker(0.001)
    try:
        first = rt.program(SCALE, "scale", OPTIONS)
        second = rt.program(SCALE, "scale", OPTIONS)
        assert isinstance(first, asyncio.Future) and first is second  # one compile, whoever asks
        assert not first.done()
        program = await first
    finally:
        await ticker.stop()
    assert len(threads) == 1 and threads[0].startswith("gpud-compile-0"), threads  # one of its threads
    assert ticker.ticks > 0, "the event loop did not run while NVRTC compiled"
    assert rt.program(SCALE, "scale", OPTIONS) is program  # cached from now on
    assert rt.stats()["nvrtc_compiles"] == 1 and rt.counters["compiles"] == 1
    await finish(rt, lost, [])


async def test_the_program_reports_its_interface(make: Make) -> None:
    rt, lost = make()
    program = await compiled(rt, SCALE, "scale")
    assert program.tensors == 2 and program.scalars == ("f32", "u32") and program.writes == frozenset({1})
    source = """
    extern "C" __global__ void gather(float* __restrict__ out, const int* idx, const float* const table,
                                      float* const extra, int k, const float bias) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < k) { out[i] = table[idx[i]] + bias; extra[i] = 1.0f; }
    }
    """
    gather = await compiled(rt, source, "gather")
    assert gather.tensors == 4 and gather.scalars == ("i32", "f32")
    assert gather.writes == frozenset({0, 3})  # const pointees are read-only; a const pointer is not
    declared = await compiled(rt, SCALE, "scale", KernelOptions(BLOCK, (), (0, 1)))
    assert declared.writes == frozenset({0, 1})  # declared writes win over the source
    await finish(rt, lost, [])


async def test_compile_error_carries_the_log(make: Make) -> None:
    rt, lost = make()
    source = 'extern "C" __global__ void k(float* x) { x[0] = undefined_thing; }'
    with pytest.raises(CompileError, match="undefined_thing"):
        await compiled(rt, source, "k")
    mangled = "__global__ void k(float* x) { x[0] = 1.0f; }"
    with pytest.raises(CompileError, match='extern "C"'):
        await compiled(rt, mangled, "k")
    assert rt.counters["compile_errors"] == 2
    await finish(rt, lost, [])


@pytest.mark.parametrize(
    "source",
    [
        "#include </etc/passwd>\n" + SCALE,
        '  #  include "/etc/passwd"\n' + SCALE,
        '#/* hidden */include "/etc/passwd"\n' + SCALE,
        '%:include "/etc/passwd"\n' + SCALE,
        '#inc\\\nlude "/etc/passwd"\n' + SCALE,
        '#if __has_include("/etc/passwd")\n#endif\n' + SCALE,
    ],
)
async def test_includes_are_rejected(make: Make, source: str) -> None:
    rt, lost = make()
    with pytest.raises(InvalidArgument, match="include"):
        await compiled(rt, source, "scale")
    assert rt.stats()["nvrtc_compiles"] == 0
    await finish(rt, lost, [])


async def test_flags_are_whitelisted(make: Make) -> None:
    rt, lost = make()
    owner = Owner()
    n = 300
    x, y = rt.alloc(n * 4), rt.alloc(n * 4)
    for flag in ("-I/etc", "--include-path=/", "--pre-include=/etc/passwd", "-DX=$(id)", "-arch=sm_50"):
        with pytest.raises(InvalidArgument, match="not allowed"):
            await compiled(rt, SCALE, "scale", KernelOptions(BLOCK, (flag,), None))
    assert rt.stats()["nvrtc_compiles"] == 0
    source = SCALE.replace("a * x[i]", "FACTOR * a * x[i]")
    flags = ("-DFACTOR=2.0f", "--use_fast_math", "--fmad=false", "-lineinfo", "--std=c++17")
    program = await compiled(rt, source, "scale", KernelOptions(BLOCK, flags, None))
    await drive(rt.upload(x, memoryview(np.ones(n, np.float32).tobytes()), owner))
    rt.dispatch(rt.prepare(program, blocks(n), scale_args(x, y, 1.5, n)), owner)
    assert np.all(floats(await read(rt, y, owner)) == 3.0)
    await finish(rt, lost, [x, y])


async def test_bad_launch_arguments_are_rejected(make: Make) -> None:
    rt, lost = make()
    owner = Owner()
    x, y = rt.alloc(64), rt.alloc(64)
    with pytest.raises(InvalidArgument, match="block"):
        await compiled(rt, SCALE, "scale", KernelOptions(None, (), None))
    with pytest.raises(InvalidArgument, match="does not fit"):
        await compiled(rt, SCALE, "scale", KernelOptions((2048, 1, 1), (), None))
    program = await compiled(rt, SCALE, "scale")
    f32, u32 = ArgKind.F32, ArgKind.U32
    with pytest.raises(InvalidArgument, match="4 arguments, 3 given"):
        rt.prepare(program, (1, 1, 1), [x, y, (f32, 1.0)])
    with pytest.raises(InvalidArgument, match="4 arguments, 5 given"):
        rt.prepare(program, (1, 1, 1), [x, y, (f32, 1.0), (u32, 16), (u32, 1)])
    if program.native.sizes is not None:  # the driver reports parameter sizes (CUDA >= 12.4)
        with pytest.raises(InvalidArgument, match="argument 1"):  # a scalar where a pointer goes
            rt.prepare(program, (1, 1, 1), [x, (f32, 1.0), (f32, 1.0), (u32, 16)])
    else:
        assert any("argument sizes" in what for what in program.unchecked), program.unchecked
    with pytest.raises(InvalidArgument, match="bad argument"):
        rt.prepare(program, (1, 1, 1), [x, y, (f32, 1.0), (u32, -1)])
    with pytest.raises(InvalidArgument, match="exceeds"):
        rt.prepare(program, (1, 1 << 20, 1), [x, y, (f32, 1.0), (u32, 16)])
    await rt.synchronize()  # the zero fills
    assert not rt.has_pending  # nothing was encoded by the refused dispatches
    rt.dispatch(rt.prepare(program, (1, 1, 1), [x, y, (f32, 1.0), (u32, 16)]), owner)  # still fine
    await rt.synchronize()
    assert not owner.lost
    await finish(rt, lost, [x, y])


async def test_disk_cache_survives_a_restart(make: Make, tmp_path: Path) -> None:
    first, lost = make()
    await compiled(first, SCALE, "scale")
    assert first.stats()["nvrtc_compiles"] == 1 and first.stats()["disk_cache_hits"] == 0
    await finish(first, lost, [])
    files = list((tmp_path / "cuda").iterdir())
    assert len(files) == 1, files
    assert (tmp_path / "cuda").stat().st_mode & 0o777 == 0o700

    second, lost = make()  # a new device instance on the same cache directory
    owner = Owner()
    n = 100
    x, y = second.alloc(n * 4), second.alloc(n * 4)
    program = await compiled(second, SCALE, "scale")
    assert second.stats()["nvrtc_compiles"] == 0 and second.stats()["disk_cache_hits"] == 1
    await drive(second.upload(x, memoryview(np.arange(n, dtype=np.float32).tobytes()), owner))
    second.dispatch(second.prepare(program, blocks(n), scale_args(x, y, 2.0, n)), owner)
    np.testing.assert_array_equal(floats(await read(second, y, owner)), np.arange(n) * 2.0)
    await finish(second, lost, [x, y])

    files[0].write_bytes(b"not a cubin")  # a corrupt entry is dropped and rebuilt
    third, lost = make()
    await compiled(third, SCALE, "scale")
    assert third.stats()["nvrtc_compiles"] == 1 and third.stats()["disk_cache_hits"] == 0
    assert files[0].read_bytes() != b"not a cubin"
    await finish(third, lost, [])


async def test_modules_of_dropped_kernels_are_unloaded(make: Make) -> None:
    rt, lost = make(kernel_cache_size=1)
    owner = Owner()
    x = rt.alloc(64)
    small = KernelOptions((128, 1, 1), (), None)
    k1 = await compiled(rt, SCALE, "scale")
    rt.dispatch(rt.prepare(k1, (1, 1, 1), scale_args(x, x, 1.0, 16)), owner)
    k2 = await compiled(rt, SCALE, "scale", small)  # evicts k1 from the program cache
    assert rt.stats()["modules"] == 2 and len(rt.programs) == 1
    del k1  # nobody holds it now: its module goes once the work that uses it is done
    gc.collect()
    await rt.synchronize()
    assert rt.stats()["modules"] == 1, "the module of a dropped kernel was not unloaded"
    rt.dispatch(rt.prepare(k2, (1, 1, 1), scale_args(x, x, 1.0, 16)), owner)  # the other still runs
    await rt.synchronize()
    assert rt.stats()["modules"] == 1 and not owner.lost
    await finish(rt, lost, [x])


# ---------------------------------------------------------------------------- replay graphs


async def test_repeated_segments_replay_as_graphs(make: Make) -> None:
    """A run of launches is built into a graph the second time its shape (kernels, grids) is seen and
    replayed from then on, with the nodes whose argument bytes differ patched; another shape launches anew."""
    rt, lost = make(graph_min_launches=16)
    owner = Owner()
    program = await compiled(rt, SCALE, "scale")
    n = 1000
    x, y = rt.alloc(n * 4), rt.alloc(n * 4)
    rng = np.random.default_rng(3)

    async def step(a: float, launches: int) -> None:
        data = rng.standard_normal(n).astype(np.float32)
        await drive(rt.upload(x, memoryview(data.tobytes()), owner))
        for i in range(launches):
            src, dst = (x, y) if i % 2 == 0 else (y, x)
            rt.dispatch(rt.prepare(program, blocks(n), scale_args(src, dst, a, n)), owner)
        got = floats(await read(rt, x if launches % 2 == 0 else y, owner))
        want = data.astype(np.float64) * a**launches
        np.testing.assert_allclose(got, want.astype(np.float32), rtol=1e-4)

    for _ in range(4):
        await step(1.01, 20)
    stats = rt.stats()
    assert stats["graphs_captured"] == 1 and stats["graph_replays"] == 2, stats
    await step(0.99, 20)  # other scalar bytes: the same graph, its 20 nodes patched
    await step(1.01, 21)  # one more launch: another shape, launched one by one
    await step(1.01, 20)  # the cached graph again, patched back
    stats = rt.stats()
    assert stats["graphs_captured"] == 1 and stats["graph_replays"] == 4, stats
    assert stats["graph_nodes_patched"] == 40, stats
    assert stats["graph_cache"]["size"] == 1
    await finish(rt, lost, [x, y])


async def test_runs_taking_turns_with_their_own_buffers_get_a_graph_each(make: Make) -> None:
    """Two sessions' runs of one shape over their own buffers, in turns: each gets its own graph the second
    time its arguments come back, and from then on both replay unpatched."""
    rt, lost = make(graph_min_launches=16)
    owner = Owner()
    program = await compiled(rt, SCALE, "scale")
    n = 1000
    pairs = [(rt.alloc(n * 4), rt.alloc(n * 4)) for _ in range(2)]
    rng = np.random.default_rng(5)

    async def step(turn: int) -> None:
        x, y = pairs[turn]
        data = rng.standard_normal(n).astype(np.float32)
        await drive(rt.upload(x, memoryview(data.tobytes()), owner))
        for i in range(20):
            src, dst = (x, y) if i % 2 == 0 else (y, x)
            rt.dispatch(rt.prepare(program, blocks(n), scale_args(src, dst, 1.01, n)), owner)
        got = floats(await read(rt, x, owner))
        np.testing.assert_allclose(got, (data.astype(np.float64) * 1.01**20).astype(np.float32), rtol=1e-4)

    for turn in (0, 1, 0, 1, 0, 1):
        await step(turn)
    settled = rt.stats()
    assert settled["graphs_captured"] == 2 and settled["graph_cache"]["size"] == 2, settled
    for turn in (0, 1, 0, 1):
        await step(turn)
    stats = rt.stats()
    assert stats["graph_nodes_patched"] == settled["graph_nodes_patched"], stats  # no patch any more
    assert stats["graph_replays"] == settled["graph_replays"] + 4 and stats["graphs_captured"] == 2, stats
    await finish(rt, lost, [b for pair in pairs for b in pair])


@pytest.mark.parametrize("pdl", [True, False], ids=["pdl", "full-edges"])
async def test_library_kernels_in_a_graph_start_while_the_one_before_finishes(make: Make, pdl: bool) -> None:
    """A graph's edges into the op library's kernels (which wait for the kernel before them first) are
    programmatic with graph_pdl, full edges into any other kernel; the chain's result is exact either way."""
    rt, lost = make(graph_pdl=pdl)
    owner = Owner()
    library = await compiled(rt, ops.source("elementwise", "cuda"), "ew_unary")
    own = await compiled(rt, SCALE, "scale")
    n = 1 << 20
    x, y = rt.alloc(n * 4), rt.alloc(n * 4)
    data = np.random.default_rng(5).standard_normal(n).astype(np.float32)
    want = data.copy()
    for _ in range(3):
        await drive(rt.upload(x, memoryview(data.tobytes()), owner))
        for i in range(20):
            src, dst = (x, y) if i % 2 == 0 else (y, x)
            if i == 10:  # a session's own kernel in the middle: full edges into it
                rt.dispatch(rt.prepare(own, blocks(n), scale_args(src, dst, 1.5, n)), owner)
            else:  # ew_unary "scale": a * x, float32 in and out
                scalars = [(ArgKind.U32, n), (ArgKind.U32, 0), (ArgKind.F32, 0.5), (ArgKind.F32, 0.0)]
                args: list[Any] = [src, dst, *scalars, (ArgKind.U32, 0), (ArgKind.U32, 0)]
                rt.dispatch(rt.prepare(library, blocks(n), args), owner)
        got = floats(await read(rt, x, owner))
    for i in range(20):
        want = want * np.float32(1.5 if i == 10 else 0.5)  # a kernel that read early would miss a factor
    np.testing.assert_array_equal(got, want)
    stats = rt.stats()
    assert stats["graphs_captured"] == 1 and stats["graph_pdl"] == pdl, stats
    assert stats["graph_programmatic_edges"] == (18 if pdl else 0), stats  # of 19: not the one into `scale`
    await finish(rt, lost, [x, y])


@pytest.mark.parametrize(
    ("settings", "launches"),
    [({"graph_cache_size": 0}, 32), ({"graph_min_launches": 16}, 8)],
    ids=["graphs-off", "short-segments"],
)
async def test_graphs_off_and_short_segments_launch_directly(
    make: Make, settings: dict[str, int], launches: int
) -> None:
    rt, lost = make(**settings)
    owner = Owner()
    program = await compiled(rt, SCALE, "scale")
    x = rt.alloc(64 * 4)
    await drive(rt.upload(x, memoryview(np.ones(64, np.float32).tobytes()), owner))
    for _ in range(3):
        for _ in range(launches):
            rt.dispatch(rt.prepare(program, blocks(64), scale_args(x, x, 2.0, 64)), owner)
        await rt.synchronize()
    assert np.all(floats(await read(rt, x, owner)) == 2.0 ** (3 * launches))
    stats = rt.stats()
    assert stats["graphs_captured"] == 0 and stats["graph_replays"] == 0, stats
    await finish(rt, lost, [x])


# ---------------------------------------------------------------------------- fatal errors


async def sticky_child(cache_dir: str) -> None:
    """Runs in a child process (see below): prints OK once every check passed."""
    rt, lost = open_runtime(Path(cache_dir))
    owner = Owner()
    x = rt.alloc(64)
    program = await compiled(rt, BAD, "bad", KernelOptions((1, 1, 1), (), None))
    rt.dispatch(rt.prepare(program, (1, 1, 1), [x]), owner)
    reading = await start_read(rt, x, owner)
    synced = rt.synchronize()
    try:
        await asyncio.wait_for(reading, 30)
    except DeviceLost as exc:
        print("download failed with DeviceLost:", exc)
    else:
        raise AssertionError("the download after an illegal address succeeded")
    try:
        await asyncio.wait_for(synced, 30)
    except DeviceLost:
        pass
    else:
        raise AssertionError("synchronize after an illegal address succeeded")
    assert len(lost) == 1 and isinstance(lost[0], DeviceLost), lost
    assert rt.ledger.lost is lost[0]
    try:
        rt.alloc(16)
    except DeviceLost:
        pass
    else:
        raise AssertionError("alloc on a lost device succeeded")
    rt.release(x)
    await asyncio.wait_for(rt.close(), 30)
    await asyncio.sleep(0.2)  # a loss reported late (a free on the submit worker) would land by now
    assert len(lost) == 1, f"on_lost was called {len(lost)} times"
    print("OK")


_CHILD = """
import asyncio, importlib.util, sys
spec = importlib.util.spec_from_file_location("cuda_test_device_child", sys.argv[1])
module = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = module  # dataclasses look their module up there
spec.loader.exec_module(module)
asyncio.run(module.sticky_child(sys.argv[2]))
"""


def run_child(cache_dir: Path) -> subprocess.CompletedProcess[str]:
    root = Path(__file__).resolve().parents[3]
    paths = [str(root), str(root / "protocol"), str(root / "client"), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    command = [sys.executable, "-c", _CHILD, __file__, str(cache_dir)]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)


async def test_a_sticky_error_is_fatal(tmp_path: Path) -> None:
    """An illegal address: DeviceLost to every waiter, on_lost called once. In a child process,
    since the error poisons the CUDA context of the whole process."""
    result = await asyncio.to_thread(run_child, tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 0 and "OK" in result.stdout, output
    assert "ILLEGAL_ADDRESS" in result.stdout or "LAUNCH_FAILED" in result.stdout, output


# Reverses each block's n floats through dynamic shared memory (extern __shared__), n = blockDim.x * per.
REVERSE = """
extern "C" __global__ void reverse(const float* x, float* y, unsigned int per) {
    extern __shared__ float s[];
    const unsigned int n = blockDim.x * per, base = blockIdx.x * n;
    for (unsigned int i = threadIdx.x; i < n; i += blockDim.x) s[i] = x[base + i];
    __syncthreads();
    for (unsigned int i = threadIdx.x; i < n; i += blockDim.x) y[base + i] = s[n - 1 - i];
}
extern "C" __global__ void twice(const float* x, float* y, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i];
}
"""


async def test_dynamic_shared_memory_past_48_kb(make: Make) -> None:
    """options.shared: the block gets that much dynamic shared memory, past the 48 KB a kernel has
    without asking (the matmul_wg kernels need up to 193 KB); more than the device has is refused."""
    rt, lost = make()
    owner = Owner()
    per, blocks_n = 100, 3  # 256 threads x 100 floats = 100 KB a block
    n = 256 * per * blocks_n
    x = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    src, dst = rt.alloc(n * 4), rt.alloc(n * 4)
    program = await compiled(rt, REVERSE, "reverse", KernelOptions(BLOCK, (), None, 256 * per * 4))
    await drive(rt.upload(src, memoryview(x.tobytes()), owner))
    rt.dispatch(rt.prepare(program, (blocks_n, 1, 1), [src, dst, (ArgKind.U32, per)]), owner)
    got = floats(await read(rt, dst, owner))
    np.testing.assert_array_equal(got, x.reshape(blocks_n, -1)[:, ::-1].ravel())
    with pytest.raises(InvalidArgument, match="dynamic shared memory"):
        await compiled(rt, REVERSE, "reverse", KernelOptions(BLOCK, (), None, 1 << 20))
    await finish(rt, lost, [src, dst])


async def test_one_source_is_compiled_once_for_all_its_entries(make: Make) -> None:
    """NVRTC builds every kernel of a source in one run: a family's second entry point loads the same
    image (before, each entry point compiled the whole source again: ~17 s for matmul_tc's first use)."""
    rt, lost = make()
    await compiled(rt, REVERSE, "reverse", KernelOptions(BLOCK, (), None, 1024))
    await compiled(rt, REVERSE, "twice")
    stats = rt.stats()
    assert stats["nvrtc_compiles"] == 1 and stats["disk_cache_hits"] == 1, stats
    await finish(rt, lost, [])

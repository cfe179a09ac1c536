"""The CUDA backend used directly, without the daemon. Needs cuda-python and an NVIDIA GPU."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpud.backends.base import Buffer
from gpud.config import Config
from gpud_protocol import ArgKind, KernelOptions
from gpud_protocol.errors import CompileError, InvalidArgument

cu = pytest.importorskip("cuda.bindings.driver")


def _has_device() -> bool:
    try:
        (err,) = cu.cuInit(0)
        err2, count = cu.cuDeviceGetCount()
    except Exception:  # no driver library
        return False
    return bool(err == 0 and err2 == 0 and count > 0)


pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not _has_device(), reason="no CUDA device")]

from gpud.backends.cuda import CudaBackend  # noqa: E402  (needs cuda-python)

SCALE = """
extern "C" __global__ void scale(const float* x, float* y, float a, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i];
}
"""
BLOCK = (256, 1, 1)
OPTIONS = KernelOptions(BLOCK, (), None)


def blocks(n: int) -> tuple[int, int, int]:
    return ((n + BLOCK[0] - 1) // BLOCK[0], 1, 1)


def make(tmp_path: Path, **config: Any) -> CudaBackend:
    """A backend on a fresh cache directory; call inside the running loop."""
    return CudaBackend(Config(cache_dir=tmp_path, **config), on_fatal=lambda _exc: None)


async def teardown(b: CudaBackend, buffers: list[Buffer]) -> None:
    assert b.fatal_error is None, b.fatal_error
    for buffer in buffers:
        b.release(buffer)
    await b.synchronize()
    assert b.memory_in_use == 0
    assert b.live_buffers == 0
    await b.close()


async def roundtrip(b: CudaBackend, data: bytes) -> bytes:
    buffer = b.alloc(len(data))
    try:
        await b.upload(buffer, memoryview(data))
        future = await b.download(buffer)
        b.flush()
        return await future
    finally:
        b.release(buffer)


# ---------------------------------------------------------------------------- correctness


def test_dependent_chain_matches_numpy(tmp_path: Path) -> None:
    async def body() -> None:
        b = make(tmp_path)
        n = 1000
        x0 = np.random.default_rng(0).standard_normal(n).astype(np.float32)
        bufs = [b.alloc(n * 4) for _ in range(3)]
        try:
            k = b.kernel(SCALE, "scale", OPTIONS)
            assert k.writes == frozenset({1})
            await b.upload(bufs[0], memoryview(x0.tobytes()))
            expect = x0.copy()
            for i in range(200):
                a = 1.01 if i % 2 else 0.995
                b.dispatch(k, blocks(n), [bufs[i % 2], bufs[(i + 1) % 2], (ArgKind.F32, a), (ArgKind.U32, n)])
                expect = expect * np.float32(a)
            b.copy(bufs[0], bufs[2])  # 200 is even: the chain ends in bufs[0]
            future = await b.download(bufs[2])
            assert b.dispatches_pending == 200
            b.flush()
            got = np.frombuffer(await future, np.float32)
            np.testing.assert_allclose(got, expect, rtol=1e-6)
            assert b.dispatch_count == 200 and b.stats()["dispatches"] == 200
        finally:
            await teardown(b, bufs)

    asyncio.run(body())


def test_odd_and_empty_sizes(tmp_path: Path) -> None:
    async def body() -> None:
        b = make(tmp_path)
        try:
            for size in (0, 1, 7, 4097, 65537):
                data = os.urandom(size)
                assert await roundtrip(b, data) == data
        finally:
            await teardown(b, [])

    asyncio.run(body())


def test_large_transfer_is_chunked(tmp_path: Path) -> None:
    async def body() -> None:
        b = make(tmp_path)
        try:
            data = os.urandom(40 << 20)
            assert await roundtrip(b, data) == data
            assert b.stats()["upload_staging"]["bytes"] <= b.config.staging_pool_bytes // 2
        finally:
            await teardown(b, [])

    asyncio.run(body())


def test_upload_keeps_its_place_in_op_order(tmp_path: Path) -> None:
    async def body() -> None:
        b = make(tmp_path)
        n = 4096
        x, y = b.alloc(n * 4), b.alloc(n * 4)
        try:
            k = b.kernel(SCALE, "scale", OPTIONS)
            ones, twos = np.ones(n, np.float32), np.full(n, 2, np.float32)
            await b.upload(x, memoryview(ones.tobytes()))
            b.dispatch(k, blocks(n), [x, y, (ArgKind.F32, 3.0), (ArgKind.U32, n)])  # reads the ones
            await b.upload(x, memoryview(twos.tobytes()))  # must not overtake the dispatch
            first = await b.download(y)
            b.dispatch(k, blocks(n), [x, y, (ArgKind.F32, 3.0), (ArgKind.U32, n)])
            second = await b.download(y)
            b.flush()
            assert np.all(np.frombuffer(await first, np.float32) == 3.0)
            assert np.all(np.frombuffer(await second, np.float32) == 6.0)
        finally:
            await teardown(b, [x, y])

    asyncio.run(body())


def test_staging_pool_exhaustion_stays_correct(tmp_path: Path) -> None:
    async def body() -> None:
        b = make(tmp_path, staging_pool_bytes=64 << 10)
        payloads = [os.urandom(16 << 10) for _ in range(32)]
        bufs = [b.alloc(len(p)) for p in payloads]
        try:
            for buffer, payload in zip(bufs, payloads, strict=True):
                await b.upload(buffer, memoryview(payload))
            futures = [await b.download(buffer) for buffer in bufs]
            b.flush()
            assert [await f for f in futures] == payloads
            stats = b.stats()
            assert stats["upload_staging"]["exhausted_waits"] > 0
            assert stats["upload_staging"]["bytes"] <= 32 << 10
            assert stats["download_staging"]["bytes"] <= 32 << 10
        finally:
            await teardown(b, bufs)

    asyncio.run(body())


def test_memory_is_returned(tmp_path: Path) -> None:
    async def body() -> None:
        b = make(tmp_path)
        try:
            free_before = b.stats()["device_memory_free"]
            bufs = [b.alloc(64 << 20) for _ in range(4)]
            assert b.memory_in_use == 256 << 20 and b.live_buffers == 4
            assert b.stats()["device_memory_free"] <= free_before - (256 << 20)
            for buffer in bufs:
                b.release(buffer)
            await b.synchronize()
            assert b.memory_in_use == 0 and b.live_buffers == 0
            assert b.stats()["device_memory_free"] >= free_before - (8 << 20)
            info = b.device_info()
            assert info["backend"] == "cuda" and info["name"] and info["memory_bytes"] > 0
            assert info["compute_capability"].count(".") == 1
        finally:
            await teardown(b, [])

    asyncio.run(body())


def test_loop_keeps_running_while_the_gpu_works(tmp_path: Path) -> None:
    sleeper = """
    extern "C" __global__ void sleeper(unsigned int ms) {
        for (unsigned int i = 0; i < ms; ++i) __nanosleep(1000000);
    }
    """

    async def body() -> None:
        b = make(tmp_path)
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        task = asyncio.create_task(ticker())
        try:
            k = b.kernel(sleeper, "sleeper", KernelOptions((1, 1, 1), (), None))
            b.dispatch(k, (1, 1, 1), [(ArgKind.U32, 400)])
            await b.synchronize()
            assert ticks >= 10, f"the event loop was blocked: {ticks} ticks during ~0.4 s of GPU work"
        finally:
            task.cancel()
            await teardown(b, [])

    asyncio.run(body())


# ---------------------------------------------------------------------------- kernels


def test_compile_error_carries_the_log(tmp_path: Path) -> None:
    async def body() -> None:
        b = make(tmp_path)
        try:
            source = 'extern "C" __global__ void k(float* x) { x[0] = undefined_thing; }'
            with pytest.raises(CompileError, match="undefined_thing"):
                b.kernel(source, "k", OPTIONS)
            mangled = "__global__ void k(float* x) { x[0] = 1.0f; }"
            with pytest.raises(CompileError, match='extern "C"'):
                b.kernel(mangled, "k", OPTIONS)
        finally:
            await teardown(b, [])

    asyncio.run(body())


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
def test_includes_are_rejected(tmp_path: Path, source: str) -> None:
    async def body() -> None:
        b = make(tmp_path)
        try:
            with pytest.raises(InvalidArgument, match="include"):
                b.kernel(source, "scale", OPTIONS)
            assert b.counters["nvrtc_compiles"] == 0
        finally:
            await teardown(b, [])

    asyncio.run(body())


def test_flags_are_whitelisted(tmp_path: Path) -> None:
    async def body() -> None:
        b = make(tmp_path)
        n = 300
        x, y = b.alloc(n * 4), b.alloc(n * 4)
        try:
            for flag in ("-I/etc", "--include-path=/", "--pre-include=/etc/passwd", "-DX=$(id)", "-arch=sm_50"):
                with pytest.raises(InvalidArgument, match="not allowed"):
                    b.kernel(SCALE, "scale", KernelOptions(BLOCK, (flag,), None))
            source = SCALE.replace("a * x[i]", "FACTOR * a * x[i]")
            flags = ("-DFACTOR=2.0f", "--use_fast_math", "--fmad=false", "-lineinfo", "--std=c++17")
            k = b.kernel(source, "scale", KernelOptions(BLOCK, flags, None))
            await b.upload(x, memoryview(np.ones(n, np.float32).tobytes()))
            b.dispatch(k, blocks(n), [x, y, (ArgKind.F32, 1.5), (ArgKind.U32, n)])
            future = await b.download(y)
            b.flush()
            assert np.all(np.frombuffer(await future, np.float32) == 3.0)
        finally:
            await teardown(b, [x, y])

    asyncio.run(body())


def test_bad_launch_arguments_are_rejected(tmp_path: Path) -> None:
    async def body() -> None:
        b = make(tmp_path)
        x, y = b.alloc(64), b.alloc(64)
        try:
            with pytest.raises(InvalidArgument, match="block"):
                b.kernel(SCALE, "scale", KernelOptions(None, (), None))
            with pytest.raises(InvalidArgument, match="too large"):
                b.kernel(SCALE, "scale", KernelOptions((2048, 1, 1), (), None))
            k = b.kernel(SCALE, "scale", OPTIONS)
            with pytest.raises(InvalidArgument, match="4 arguments, 3 given"):
                b.dispatch(k, (1, 1, 1), [x, y, (ArgKind.F32, 1.0)])
            with pytest.raises(InvalidArgument, match="4 arguments, 5 given"):
                b.dispatch(k, (1, 1, 1), [x, y, (ArgKind.F32, 1.0), (ArgKind.U32, 16), (ArgKind.U32, 1)])
            with pytest.raises(InvalidArgument, match="argument 1"):
                b.dispatch(k, (1, 1, 1), [x, (ArgKind.F32, 1.0), (ArgKind.F32, 1.0), (ArgKind.U32, 16)])
            with pytest.raises(InvalidArgument):
                b.dispatch(k, (1, 1, 1), [x, y, (ArgKind.F32, 1.0), (ArgKind.U32, -1)])
            with pytest.raises(InvalidArgument, match="exceeds"):
                b.dispatch(k, (1, 1 << 20, 1), [x, y, (ArgKind.F32, 1.0), (ArgKind.U32, 16)])
            assert not b.has_pending
            b.dispatch(k, (1, 1, 1), [x, y, (ArgKind.F32, 1.0), (ArgKind.U32, 16)])  # still fine
            writes = b.kernel(SCALE, "scale", KernelOptions(BLOCK, (), (0, 1)))
            assert writes.writes == frozenset({0, 1})
        finally:
            await teardown(b, [x, y])

    asyncio.run(body())


def test_disk_cache_survives_a_restart(tmp_path: Path) -> None:
    async def body() -> None:
        first = make(tmp_path)
        first.kernel(SCALE, "scale", OPTIONS)
        assert first.counters["nvrtc_compiles"] == 1
        await teardown(first, [])
        files = list((tmp_path / "cuda").iterdir())
        assert len(files) == 1
        assert (tmp_path / "cuda").stat().st_mode & 0o777 == 0o700

        second = make(tmp_path)
        n = 100
        x, y = second.alloc(n * 4), second.alloc(n * 4)
        try:
            k = second.kernel(SCALE, "scale", OPTIONS)
            assert second.counters["nvrtc_compiles"] == 0
            assert second.counters["disk_cache_hits"] == 1
            await second.upload(x, memoryview(np.arange(n, dtype=np.float32).tobytes()))
            second.dispatch(k, blocks(n), [x, y, (ArgKind.F32, 2.0), (ArgKind.U32, n)])
            future = await second.download(y)
            second.flush()
            np.testing.assert_array_equal(np.frombuffer(await future, np.float32), np.arange(n) * 2.0)
        finally:
            await teardown(second, [x, y])

        files[0].write_bytes(b"not a cubin")  # a corrupt entry is dropped and rebuilt
        third = make(tmp_path)
        try:
            third.kernel(SCALE, "scale", OPTIONS)
            assert third.counters["nvrtc_compiles"] == 1
        finally:
            await teardown(third, [])

    asyncio.run(body())


def test_modules_of_dropped_kernels_are_unloaded(tmp_path: Path) -> None:
    async def body() -> None:
        b = make(tmp_path, kernel_cache_size=1)
        x = b.alloc(64)
        try:
            k1 = b.kernel(SCALE, "scale", OPTIONS)
            b.dispatch(k1, (1, 1, 1), [x, x, (ArgKind.F32, 1.0), (ArgKind.U32, 16)])
            b.kernel(SCALE, "scale", KernelOptions((128, 1, 1), (), None))  # evicts k1 from the cache
            assert b.stats()["modules"] == 2
            del k1  # nobody holds it now; its module goes once the work that uses it is done
            await b.synchronize()
            b.dispatch(b.kernel(SCALE, "scale", KernelOptions((128, 1, 1), (), None)), (1, 1, 1),
                       [x, x, (ArgKind.F32, 1.0), (ArgKind.U32, 16)])  # fmt: skip
            await b.synchronize()
            assert b.stats()["modules"] == 1
        finally:
            await teardown(b, [x])

    asyncio.run(body())


# ---------------------------------------------------------------------------- fatal errors

_FATAL_SCRIPT = """
import asyncio, sys
from gpud_protocol import ArgKind, KernelOptions
from gpud.backends.cuda import CudaBackend
from gpud.config import Config
from gpud_protocol.errors import DeviceLost

BAD = 'extern "C" __global__ void bad(float* p) { *(volatile float*)(p + (1ull << 40)) = 1.0f; }'

async def main():
    fatal = []
    b = CudaBackend(Config(cache_dir=sys.argv[1]), on_fatal=fatal.append)
    x = b.alloc(64)
    k = b.kernel(BAD, "bad", KernelOptions((1, 1, 1), (), None))
    b.dispatch(k, (1, 1, 1), [x])
    future = await b.download(x)
    b.flush()
    try:
        await asyncio.wait_for(future, 30)
    except DeviceLost as exc:
        print("download failed with DeviceLost:", exc)
    assert fatal and isinstance(fatal[0], DeviceLost), fatal
    assert isinstance(b.fatal_error, DeviceLost)
    b.release(x)
    await asyncio.wait_for(b.close(), 30)
    print("OK")

asyncio.run(main())
"""


def test_sticky_error_is_fatal(tmp_path: Path) -> None:
    # In a child process: an illegal address poisons the whole CUDA context of the process.
    root = Path(__file__).resolve().parents[2]
    path = os.pathsep.join([str(root), str(root / "protocol"), os.environ.get("PYTHONPATH", "")])
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_FATAL_SCRIPT), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": path},
    )
    assert result.returncode == 0 and "OK" in result.stdout, result.stdout + result.stderr
    assert "ILLEGAL_ADDRESS" in result.stdout or "LAUNCH_FAILED" in result.stdout, result.stdout


# ---------------------------------------------------------------------------- replay graphs


def test_repeated_segments_replay_as_graphs(tmp_path: Path) -> None:
    """The same run of launches is captured once and replayed; any difference launches anew."""

    async def body() -> None:
        b = make(tmp_path, graph_min_launches=16)
        k = b.kernel(SCALE, "scale", OPTIONS)
        n = 1000
        x, y = b.alloc(n * 4), b.alloc(n * 4)
        rng = np.random.default_rng(3)

        async def step(a: float, launches: int) -> np.ndarray:
            data = rng.standard_normal(n).astype(np.float32)
            await b.upload(x, memoryview(data.tobytes()))
            for i in range(launches):
                src, dst = (x, y) if i % 2 == 0 else (y, x)
                b.dispatch(k, blocks(n), [src, dst, (ArgKind.F32, a), (ArgKind.U32, n)])
            future = await b.download(x if launches % 2 == 0 else y)
            b.flush()
            got = np.frombuffer(await future, np.float32)
            want = data.astype(np.float64) * a**launches
            np.testing.assert_allclose(got, want.astype(np.float32), rtol=1e-4)
            return got

        for _ in range(4):
            await step(1.01, 20)
        assert b.counters["graphs_captured"] == 1
        assert b.counters["graph_replays"] == 2
        await step(0.99, 20)  # other scalar bytes: a different segment, launched one by one
        await step(1.01, 21)  # one more launch: a different segment
        await step(1.01, 20)  # the cached graph again
        assert b.counters["graph_replays"] == 3
        assert b.stats()["graph_cache"]["size"] == 1
        await teardown(b, [x, y])

    asyncio.run(body())


def test_graphs_off_and_short_segments_launch_directly(tmp_path: Path) -> None:
    async def body() -> None:
        b = make(tmp_path, graph_cache_size=0)
        k = b.kernel(SCALE, "scale", OPTIONS)
        x = b.alloc(64 * 4)
        await b.upload(x, memoryview(np.ones(64, np.float32).tobytes()))
        for _ in range(3):
            for _ in range(32):
                b.dispatch(k, blocks(64), [x, x, (ArgKind.F32, 1.0), (ArgKind.U32, 64)])
            await b.synchronize()
        assert b.counters["graphs_captured"] == 0
        await teardown(b, [x])

    asyncio.run(body())

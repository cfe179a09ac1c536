"""Every device of the host through one daemon, proven on two fake devices (CI) and on every CUDA
device where there are several (`pytest -m cuda` on a multi-GPU machine)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import numpy as np
import pytest
from support import assert_close, axpb, occupy, ref_axpb, run_axpb

import gpud_client
from gpud.backends import cuda_problem
from gpud.testing import spawn
from gpud_client import InvalidArgument, OutOfMemory, status

MiB = 1 << 20


def _cuda_devices() -> int:
    if cuda_problem() is not None:
        return 0
    from gpud.backends import cuda

    return cuda.device_count()


BACKENDS = [
    pytest.param("fake", id="fake"),  # peer to peer, ordered by markers
    pytest.param("fake-host", id="fake-host"),  # through host memory, as WebGPU devices copy
    pytest.param(
        "cuda",
        id="cuda",
        marks=[pytest.mark.cuda, pytest.mark.skipif(_cuda_devices() < 2, reason="needs two CUDA devices")],
    ),
]


@pytest.fixture(scope="module", params=BACKENDS)
def two_devices(request: pytest.FixtureRequest) -> Iterator[str]:
    args = ("--session-memory-bytes", str(16 * MiB), "--devices", "0,1")
    backend, _, path = request.param.partition("-")
    env = {"GPUD_FAKE_PEER": "0" if path == "host" else None}
    with spawn.daemon(backend, extra_args=args, env=env) as (address, proc):
        yield address
        assert proc.poll() is None


async def test_the_welcome_lists_every_device_and_sessions_spread(two_devices: str) -> None:
    async with gpud_client.connect(two_devices) as a, gpud_client.connect(two_devices) as b:
        assert [d["index"] for d in a.devices] == [0, 1]
        assert {a.device, b.device} == {0, 1}  # the least loaded device for each new session
    async with gpud_client.connect(two_devices, device=1) as c:
        assert c.device == 1
        assert c.empty(4).device == 1


async def test_work_runs_on_the_device_of_its_tensors(two_devices: str) -> None:
    async with gpud_client.connect(two_devices, device=0) as gpu:
        k = await axpb(gpu)
        data = np.arange(1000, dtype=np.float32)
        for device in (0, 1):
            x, y = gpu.tensor(data, device=device), gpu.empty(1000, device=device)
            run_axpb(gpu, k, x, y, 2.0, float(device))
            assert_close(await y.numpy(), ref_axpb(data, 2.0, float(device)))
        stats = await gpu.stats()
        assert all(d["dispatches"] >= 1 for d in stats["devices"])
        x0, y1 = gpu.tensor(data, device=0), gpu.empty(1000, device=1)
        run_axpb(gpu, k, x0, y1, 1.0, 0.0)
        with pytest.raises(InvalidArgument, match="device") as info:
            await y1.numpy()
        assert info.value.op == "dispatch"


async def test_copies_between_devices_keep_op_order(two_devices: str, request: pytest.FixtureRequest) -> None:
    """Each copy sees the writes to its source queued before it, and later reads of its target see
    the copy; a later write to the source does not reach the copy."""
    async with gpud_client.connect(two_devices, device=0) as gpu:
        k = await axpb(gpu)
        n = 1_200_000  # two readback parts on the host path
        rng = np.random.default_rng(3)
        x = rng.standard_normal(n).astype(np.float32)
        src, tmp = gpu.tensor(x, device=0), gpu.empty(n, device=0)
        dst, out = gpu.empty(n, device=1), gpu.empty(n, device=1)
        expect = x
        for step in range(5):
            run_axpb(gpu, k, src, tmp, 1.5, float(step))  # on device 0
            gpu.copy(tmp, dst)  # to device 1
            run_axpb(gpu, k, src, tmp, 0.0, -1.0)  # overwrite the source after the copy
            run_axpb(gpu, k, dst, out, 1.0, 1.0)  # on device 1, reads the copy
            expect_out = ref_axpb(ref_axpb(expect, 1.5, float(step)), 1.0, 1.0)
            assert_close(await out.numpy(), expect_out)
            assert_close(await tmp.numpy(), np.full(n, -1.0, np.float32))
        way = "host_copy_bytes" if request.node.callspec.params["two_devices"] == "fake-host" else "peer_copy_bytes"
        assert (await gpu.stats())["devices"][0][way] == 5 * 4 * n


async def test_a_session_that_ends_mid_copy_gives_its_memory_back(two_devices: str) -> None:
    """A copy between devices still waiting behind the target's earlier work when its session ends: it
    completes, and then both devices' memory is back where it was."""
    async with gpud_client.connect(two_devices, device=1) as busy:
        await occupy(busy, 0.5)  # the target device busy for about half a second
        before = [d["memory_in_use"] for d in status.query(two_devices)["devices"]]
        async with gpud_client.connect(two_devices, device=0) as gpu:
            src = gpu.tensor(np.ones(1 << 20, np.float32), device=0)
            gpu.copy(src, gpu.empty(1 << 20, device=1))
            await gpu.flush()  # the copy is on its way; the session ends now
        for _ in range(200):
            after = [d["memory_in_use"] for d in status.query(two_devices)["devices"]]
            if after == before:
                break
            await asyncio.sleep(0.02)
        assert after == before


async def test_quotas_count_per_device(two_devices: str) -> None:
    async with gpud_client.connect(two_devices, device=0) as gpu:
        gpu.empty(16 * MiB, "uint8", device=0)
        gpu.empty(16 * MiB, "uint8", device=1)  # the quota is per device: fits
        await gpu.sync()
        gpu.empty(1, "uint8", device=0)
        with pytest.raises(OutOfMemory, match="device 0"):
            await gpu.sync()


async def test_a_resident_lives_on_one_device_and_open_says_which(two_devices: str) -> None:
    name = f"test/dev1-{uuid.uuid4().hex[:8]}"
    data = np.arange(256, dtype=np.float32)
    async with gpud_client.connect(two_devices, device=0) as owner, gpud_client.connect(two_devices) as reader:
        owner.publish(owner.tensor(data, device=1), name)
        await owner.sync()
        w = await reader.open(name)
        assert w.device == 1
        np.testing.assert_array_equal(await w.numpy(), data)
        k = await axpb(reader)
        y = reader.empty(256, device=1)
        run_axpb(reader, k, w, y, 2.0, 0.0)
        assert_close(await y.numpy(), data * 2)
        owner.unpublish(name)


async def test_an_unknown_device_is_a_clear_error(two_devices: str) -> None:
    async with gpud_client.connect(two_devices) as gpu:
        with pytest.raises(InvalidArgument, match="no device 5"):
            gpu.empty(4, device=5)
    with pytest.raises(InvalidArgument, match="no device 7"):
        async with gpud_client.connect(two_devices, device=7):
            pass

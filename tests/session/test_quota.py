"""Quotas: a session's device memory per device, and the resident store's daemon-wide bounds."""

from __future__ import annotations

import uuid

import numpy as np
import pytest
from support import check_well_behaved, wait_for_memory

import gpud_client
from gpud.testing import spawn
from gpud_client import OutOfMemory

MiB = 1 << 20


async def test_published_tensors_stay_in_their_publishers_quota() -> None:
    """Regression: alloc 1 GiB, publish, free the handle, ten times: 10 GiB held against an 8 GiB
    quota with `private_bytes` 0. A published tensor now counts until it is unpublished."""
    args = ("--session-memory-bytes", str(8 * MiB))
    with spawn.daemon("webgpu", extra_args=args) as (address, _proc):
        async with gpud_client.connect(address) as gpu:
            baseline = (await gpu.stats())["device"]
            names = []
            for i in range(8):
                t = gpu.empty(MiB, "uint8")
                names.append(f"test/quota-{uuid.uuid4().hex[:8]}-{i}")
                gpu.publish(t, names[-1])
                t.free()
            assert (await gpu.stats())["session"]["private_bytes"] == 8 * MiB
            gpu.empty(MiB, "uint8")
            with pytest.raises(OutOfMemory, match="quota"):
                await gpu.sync()
            for name in names:
                gpu.unpublish(name)
            assert (await gpu.stats())["session"]["private_bytes"] == 0
            await check_well_behaved(gpu)
        await wait_for_memory(address, baseline)


async def test_the_resident_store_has_daemon_wide_bounds() -> None:
    args = ("--resident-max-count", "2", "--resident-max-bytes", str(3 * MiB))
    with spawn.daemon("webgpu", extra_args=args) as (address, _proc):
        async with gpud_client.connect(address) as gpu:
            a, b, c = (gpu.empty(MiB, "uint8") for _ in range(3))
            gpu.publish(a, "test/a")
            gpu.publish(b, "test/b")
            gpu.publish(c, "test/c")  # a third name: over the count bound
            with pytest.raises(OutOfMemory, match="resident"):
                await gpu.sync()
            gpu.unpublish("test/b")
            big = gpu.empty(3 * MiB, "uint8")
            gpu.publish(big, "test/big")  # 1 + 3 MiB: over the bytes bound
            with pytest.raises(OutOfMemory, match="resident"):
                await gpu.sync()
            gpu.publish(c, "test/c")
            await gpu.sync()


async def test_a_session_that_ends_leaves_its_published_tensors_to_the_store(address: str) -> None:
    name = f"test/orphan-{uuid.uuid4().hex[:8]}"
    data = np.arange(256, dtype=np.float32)
    async with gpud_client.connect(address) as publisher:
        publisher.publish(publisher.tensor(data), name)
        await publisher.sync()
    async with gpud_client.connect(address) as reader:
        t = await reader.open(name)
        np.testing.assert_array_equal(await t.numpy(), data)
        assert (await reader.stats())["session"]["private_bytes"] == 0  # a reader is not charged
        reader.unpublish(name)  # its publisher is gone: anyone may clean up
        t.free()
        await reader.sync()

"""Resident tensors (gpud/resident.py) across sessions, against a real daemon on every backend.

What is checked: a resident stays on the device between its producer and its consumers (the
daemon's transfer counters move only by what the test itself uploads and reads back); a reader
sees exactly what a writer flushed before it; read-only handles refuse every write path; memory
is held once and freed only after the name and every handle are gone; a client killed mid-stream
is cleaned up without disturbing anyone else; names are checked.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
from support import (
    Daemon,
    assert_close,
    axpb,
    check_well_behaved,
    device_memory,
    last_seq,
    ref_axpb,
    run_axpb,
    wait_for_memory,
)

import gpud_client
from gpud.testing import spawn
from gpud.testing import workloads as kernels
from gpud_client import (
    AlreadyExists,
    Client,
    InvalidArgument,
    Kernel,
    NotFound,
    OutOfMemory,
    PermissionDenied,
    Tensor,
    u32,
)


def _name(prefix: str) -> str:
    """A name no other test uses (the daemon is shared by the whole session)."""
    return f"test/resident-{prefix}-{uuid.uuid4().hex[:12]}"


async def axpw(gpu: Client, *, writes: list[int] | None = None) -> Kernel:
    """The built-in axpw: y = x * a + w. Args: x, w, y, a (f32), n (u32); only y is written."""
    source, options = kernels.axpw_source(gpu.backend)
    if writes is None and gpu.backend == "cuda":
        writes = [2]
    return await gpu.kernel(source, "axpw", writes=writes, **options)  # type: ignore[arg-type]


def run_axpw(
    gpu: Client, k: Kernel, x: Tensor, w: Tensor, y: Tensor, a: float, writes: list[int] | None = None
) -> None:
    n = x.shape[0]
    gpu.dispatch(k, kernels.groups(n), [x, w, y, float(a), u32(n)], writes=writes)


def ref_axpw(x: np.ndarray, w: np.ndarray, a: float) -> np.ndarray:
    return (x.astype(np.float32) * np.float32(a) + w.astype(np.float32)).astype(np.float32)


def transfers(device: dict[str, Any]) -> tuple[int, int]:
    """(upload_bytes, download_bytes): the daemon-wide host<->device byte counters."""
    return int(device.get("upload_bytes", 0)), int(device.get("download_bytes", 0))


def plus(baseline: dict[str, Any], nbytes: int, buffers: int) -> dict[str, Any]:
    """`baseline` with `buffers` more live buffers holding `nbytes` more bytes (for wait_for_memory)."""
    return {
        "memory_in_use": baseline["memory_in_use"] + nbytes,
        "live_buffers": baseline["live_buffers"] + buffers,
    }


# --------------------------------------------------------------------------- keep on device


async def _decode(address: str, name: str, seed: int, n: int, encoded: np.ndarray) -> None:
    """A consumer: opens the resident, runs a chain of axpw reading it, reads back only the end."""
    rng = np.random.default_rng(seed)
    async with gpud_client.connect(address) as gpu:
        w = await gpu.open(name)
        assert (w.mode, w.shape, w.dtype) == ("ro", (n,), np.dtype("float32"))
        k = await axpw(gpu)
        assert k.writes == (2,)
        x = rng.standard_normal(n).astype(np.float32)
        tx = gpu.tensor(x)  # upload: n * 4 bytes
        bufs = [gpu.empty(n), gpu.empty(n)]
        ref, src = x, tx
        for step in range(6):
            a = float(rng.uniform(0.3, 0.7))
            dst = bufs[step % 2]
            run_axpw(gpu, k, src, w, dst, a)
            ref = ref_axpw(ref, encoded, a)
            src = dst
        assert_close(await src.numpy(), ref)  # download: n * 4 bytes


async def test_encoder_output_stays_on_device(address: str) -> None:
    """Producer -> resident -> consumers with no host round trip of the resident's bytes."""
    n = 1 << 14
    name = _name("encoder-out")
    inp = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    encoded = ref_axpb(ref_axpb(inp, 0.5, 1.0), 2.0, -1.0)
    baseline = await device_memory(address)
    up0, down0 = transfers(baseline)

    async with gpud_client.connect(address) as encoder:
        k = await axpb(encoder)
        x = encoder.tensor(inp)  # upload: n * 4 bytes
        hidden = encoder.empty(n)
        out = encoder.empty(n)
        encoder.publish(out, name, "ro")  # published first: the publisher's own handle still writes it
        run_axpb(encoder, k, x, hidden, 0.5, 1.0)
        run_axpb(encoder, k, hidden, out, 2.0, -1.0)
        await encoder.flush()  # accepted by the daemon: consumers' work is ordered after it
        x.free()
        hidden.free()
        await asyncio.gather(
            _decode(address, name, 2, n, encoded),
            _decode(address, name, 3, n, encoded),
        )

    up1, down1 = transfers(await device_memory(address))
    assert up1 - up0 == 3 * n * 4  # the encoder's input and each consumer's input, nothing else
    assert down1 - down0 == 2 * n * 4  # each consumer's final result, nothing else

    async with gpud_client.connect(address) as cleanup:
        cleanup.unpublish(name)
        await cleanup.sync()
    await wait_for_memory(address, baseline)


# --------------------------------------------------------------------------- ordering across sessions


async def test_reader_sees_each_upload_flushed_by_the_writer(address: str) -> None:
    n = 1 << 16
    name = _name("rw-upload")
    rng = np.random.default_rng(21)
    baseline = await device_memory(address)
    async with gpud_client.connect(address) as writer, gpud_client.connect(address) as reader:
        own = writer.tensor(np.zeros(n, dtype=np.float32))
        writer.publish(own, name, "rw")
        await writer.sync()
        own.free()  # the writer goes through an opened handle too
        w = await writer.open(name)
        r = await reader.open(name)
        assert w.mode == r.mode == "rw"
        for _ in range(30):
            data = rng.standard_normal(n).astype(np.float32)
            w.upload(data)
            await writer.flush()
            np.testing.assert_array_equal(await r.numpy(), data)
        writer.unpublish(name)
        await writer.sync()
    await wait_for_memory(address, baseline)


async def test_reader_sees_each_dispatch_flushed_by_the_writer(address: str) -> None:
    n = 5000  # not a multiple of the block size
    name = _name("rw-dispatch")
    rng = np.random.default_rng(22)
    baseline = await device_memory(address)
    async with gpud_client.connect(address) as writer, gpud_client.connect(address) as reader:
        owner = writer.empty(n)
        writer.publish(owner, name, "rw")
        kw = await axpb(writer)
        kr = await axpb(reader)
        src = writer.empty(n)
        r = await reader.open(name)
        out = reader.empty(n)
        for _ in range(30):
            x = rng.standard_normal(n).astype(np.float32)
            a, b = float(rng.uniform(-2, 2)), float(rng.uniform(-2, 2))
            src.upload(x)
            run_axpb(writer, kw, src, owner, a, b)
            await writer.flush()
            run_axpb(reader, kr, r, out, 2.0, 1.0)
            assert_close(await out.numpy(), ref_axpb(ref_axpb(x, a, b), 2.0, 1.0))
        writer.unpublish(name)
        await writer.sync()
    await wait_for_memory(address, baseline)


# --------------------------------------------------------------------------- read-only enforcement


async def test_read_only_handle_refuses_every_write_path(address: str) -> None:
    n = 300
    name = _name("ro")
    data = np.random.default_rng(31).standard_normal(n).astype(np.float32)
    baseline = await device_memory(address)
    async with gpud_client.connect(address) as publisher, gpud_client.connect(address) as reader:
        own = publisher.tensor(data)
        publisher.publish(own, name, "ro")
        await publisher.sync()
        r = await reader.open(name)
        assert r.mode == "ro"
        kb, kw = await axpb(reader), await axpw(reader)
        y = reader.tensor(np.ones(n, dtype=np.float32))
        z = reader.empty(n)

        async def denied(op: str) -> None:
            """The op queued last fails at the next await, naming itself; then the session goes on."""
            bad_seq = last_seq(reader)
            with pytest.raises(PermissionDenied) as info:
                await y.numpy()
            assert info.value.op == op and info.value.seq == bad_seq, info.value
            if op != "publish":
                assert name in info.value.message  # which resident refused
            np.testing.assert_array_equal(await y.numpy(), np.ones(n, dtype=np.float32))  # seen: not sticky

        r.upload(np.zeros(n, dtype=np.float32))
        await denied("upload")

        reader.copy(y, r)
        await denied("copy")

        run_axpb(reader, kb, y, r, 2.0, 1.0)  # the kernel writes its second tensor
        await denied("dispatch")

        run_axpw(reader, kw, y, z, r, 1.0)  # axpw writes its third tensor
        await denied("dispatch")

        run_axpw(reader, kw, y, r, z, 1.0, writes=[1, 2])  # an explicit writes naming it
        await denied("dispatch")

        reader.dispatch(kb, kernels.groups(n), [r, z, 1.0, 0.0, u32(n)], writes=[0, 1])
        await denied("dispatch")

        reader.publish(r, _name("widened"), "rw")  # no widening the mode by republishing
        await denied("publish")

        # Every request queued after the failure, or already in flight, gets the same error once.
        reader.copy(y, r)
        bad_seq = last_seq(reader)
        results = await asyncio.gather(y.numpy(), reader.sync(), r.numpy(), return_exceptions=True)
        for result in results:
            assert isinstance(result, PermissionDenied), result
            assert (result.op, result.seq) == ("copy", bad_seq)

        # Reads of the resident work: as a kernel input (default and explicit writes), a copy source.
        run_axpb(reader, kb, r, z, 2.0, 1.0)
        assert_close(await z.numpy(), ref_axpb(data, 2.0, 1.0))
        run_axpw(reader, kw, y, r, z, 3.0)
        assert_close(await z.numpy(), ref_axpw(np.ones(n, dtype=np.float32), data, 3.0))
        run_axpw(reader, kw, z, r, y, -1.0, writes=[2])
        assert_close(await y.numpy(), ref_axpw(ref_axpw(np.ones(n, dtype=np.float32), data, 3.0), data, -1.0))
        reader.copy(r, z)
        np.testing.assert_array_equal(await z.numpy(), data)
        np.testing.assert_array_equal(await r.numpy(), data)  # untouched by all of the above

        # Read-only binds other sessions: the publisher's own handle still writes it.
        own.upload(data * 2)
        await publisher.flush()
        np.testing.assert_array_equal(await r.numpy(), data * 2)

        publisher.unpublish(name)
        await publisher.sync()
    await wait_for_memory(address, baseline)


@pytest.mark.parametrize("where", ["dispatch", "dispatch-empty", "kernel"])
async def test_declared_writes_cannot_hide_a_write_the_daemon_sees(address: str, where: str) -> None:
    """WGSL states every binding's access mode: a `writes` that leaves out a read_write binding is
    a false declaration the daemon can see through, and must not let a read-only resident be written."""
    n = 64
    name = _name("ro-declared")
    data = np.arange(n, dtype=np.float32)
    async with gpud_client.connect(address) as publisher, gpud_client.connect(address) as reader:
        if reader.backend != "webgpu":
            pytest.skip("CUDA C does not state what a kernel writes for sure: a declaration is all there is")
        publisher.publish(publisher.tensor(data), name, "ro")
        await publisher.sync()
        r = await reader.open(name)
        y = reader.tensor(np.ones(n, dtype=np.float32))
        if where == "kernel":
            k = await axpb(reader, writes=[0])  # claims it writes x, not y
            run_axpb(reader, k, y, r, 2.0, 1.0)
        else:
            k = await axpb(reader)
            assert k.writes == (1,)  # the daemon knows
            writes = [0] if where == "dispatch" else []
            reader.dispatch(k, kernels.groups(n), [y, r, 2.0, 1.0, u32(n)], writes=writes)
        try:
            with pytest.raises(PermissionDenied):
                await y.numpy()
        finally:
            resident_now = await r.numpy()
            publisher.unpublish(name)
            await publisher.sync()
        np.testing.assert_array_equal(resident_now, data)


# --------------------------------------------------------------------------- reference counts and lifetime


async def test_memory_held_once_and_freed_after_unpublish_and_last_handle(address: str) -> None:
    n = 10_000
    nbytes = n * 4
    name = _name("shared")
    data = np.random.default_rng(41).standard_normal(n).astype(np.float32)
    baseline = await device_memory(address)
    with_resident = plus(baseline, nbytes, 1)

    async with gpud_client.connect(address) as publisher:
        t = publisher.tensor(data)
        publisher.publish(t, name, "ro")
        await publisher.sync()
        stats = await publisher.stats()
        assert stats["session"]["private_bytes"] == nbytes  # charged to its owner while it holds it
        assert stats["residents"]["count"] >= 1 and stats["residents"]["bytes"] >= nbytes
    # The publisher's session is gone; the resident is not.
    await wait_for_memory(address, with_resident)

    async with (
        gpud_client.connect(address) as one,
        gpud_client.connect(address) as two,
        gpud_client.connect(address) as three,
    ):
        handles = [await s.open(name) for s in (one, two, three)]
        for s, h in zip((one, two, three), handles, strict=True):
            assert (await s.stats())["session"]["private_bytes"] == 0
            np.testing.assert_array_equal(await h.numpy(), data)
        await wait_for_memory(address, with_resident)  # three opens, one buffer

        one.unpublish(name)
        await one.sync()
        with pytest.raises(NotFound):
            await two.open(name)
        with pytest.raises(NotFound):
            await one.open(name)
        # The opened handles stay valid: read back and used by a kernel.
        for h in handles:
            np.testing.assert_array_equal(await h.numpy(), data)
        k = await axpb(three)
        y = three.empty(n)
        run_axpb(three, k, handles[2], y, -1.0, 0.5)
        assert_close(await y.numpy(), ref_axpb(data, -1.0, 0.5))
        y.free()
        await three.sync()
        await wait_for_memory(address, with_resident)

        handles[0].free()
        await one.sync()
        await wait_for_memory(address, with_resident)
        async with gpud_client.connect(address) as later:  # unpublished: nobody new gets in
            with pytest.raises(NotFound):
                await later.open(name)
    # `two` and `three` closed with their handles (`three` never freed its own): all gone.
    await wait_for_memory(address, baseline)


async def test_published_without_handles_is_freed_by_unpublish(address: str) -> None:
    n = 3000
    name = _name("orphan")
    baseline = await device_memory(address)
    async with gpud_client.connect(address) as publisher:
        t = publisher.tensor(np.full(n, 7.0, dtype=np.float32))
        publisher.publish(t, name, "rw")
        t.free()  # only the name holds it now
        await publisher.sync()
    async with gpud_client.connect(address) as reader:
        r = await reader.open(name)
        np.testing.assert_array_equal(await r.numpy(), np.full(n, 7.0, dtype=np.float32))
        r.free()
        await reader.sync()
    await wait_for_memory(address, plus(baseline, n * 4, 1))  # every handle gone, the name keeps it
    async with gpud_client.connect(address) as anyone:
        anyone.unpublish(name)
        await anyone.sync()
        with pytest.raises(NotFound):
            await anyone.open(name)
    await wait_for_memory(address, baseline)


async def test_unpublish_gives_the_tensor_back_to_its_owners_quota(tmp_path: Path) -> None:
    config = tmp_path / "gpud.toml"
    config.write_text("[gpud]\nsession_memory_bytes = 100000\n")
    with spawn.daemon("webgpu", extra_args=("--config", str(config))) as (address, _proc):
        async with gpud_client.connect(address) as gpu:
            first = gpu.empty(20_000)  # 80 kB of a 100 kB quota
            gpu.publish(first, "test/quota")
            gpu.unpublish("test/quota")  # private again: held by this session's handle alone
            await gpu.sync()
            gpu.empty(20_000)
            with pytest.raises(OutOfMemory):
                await gpu.sync()


# --------------------------------------------------------------------------- a client killed mid-stream

_VICTIM = textwrap.dedent(
    """
    import asyncio, sys
    import numpy as np
    import gpud_client
    from gpud.testing import workloads as kernels

    async def main(address, name):
        async with gpud_client.connect(address) as gpu:
            source, options = kernels.axpw_source(gpu.backend)
            k = await gpu.kernel(source, "axpw", **options)
            w = await gpu.open(name)
            n = w.shape[0]
            x = gpu.tensor(np.ones(n, dtype=np.float32))
            ys = [gpu.empty(n) for _ in range(3)]  # with x: 4 MiB of private tensors
            await gpu.sync()
            print("ready", flush=True)
            i = 0
            while True:
                y = ys[i % 3]
                gpu.dispatch(k, kernels.groups(n), [x, w, y, 0.5, gpud_client.u32(n)])
                gpu.dispatch(k, kernels.groups(n), [y, w, ys[(i + 1) % 3], 0.5, gpud_client.u32(n)])
                await y.numpy()
                i += 1

    asyncio.run(main(sys.argv[1], sys.argv[2]))
    """
)


async def test_client_killed_mid_stream_is_cleaned_up(private_daemon: Daemon) -> None:
    address = private_daemon.address
    n = 1 << 18  # 1 MiB of float32
    name = _name("victim-reads")
    data = np.random.default_rng(51).standard_normal(n).astype(np.float32)
    baseline = await device_memory(address)
    async with gpud_client.connect(address) as publisher, gpud_client.connect(address) as bystander:
        publisher.publish(publisher.tensor(data), name, "ro")
        await publisher.sync()
        with_resident = plus(baseline, n * 4, 1)
        k = await axpb(bystander)
        await check_well_behaved(bystander, k)

        victim = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _VICTIM, address, name, stdout=asyncio.subprocess.PIPE
        )
        try:
            assert victim.stdout is not None
            with anyio.fail_after(30):
                line = await victim.stdout.readline()
            assert line.strip() == b"ready", line
            during = await device_memory(address)
            assert during["memory_in_use"] >= with_resident["memory_in_use"] + 4 * n * 4
            await anyio.sleep(0.2)  # well into its loop
            assert victim.returncode is None
            victim.send_signal(signal.SIGKILL)
            await victim.wait()
            assert victim.returncode == -signal.SIGKILL

            # While the daemon notices (its lease is 1 s), others work undisturbed.
            rounds, until = 0, time.monotonic() + 1.5
            while time.monotonic() < until:
                await check_well_behaved(bystander, k, seed=rounds)
                rounds += 1
            assert rounds > 0
            bystander.trim()  # its freed tensors, pooled for reuse (gpud_client.pool), are freed too
            await bystander.flush()  # its last frees
            await wait_for_memory(address, with_resident, timeout=10)
        finally:
            if victim.returncode is None:
                victim.kill()
                await victim.wait()

        r = await bystander.open(name)
        np.testing.assert_array_equal(await r.numpy(), data)
        await check_well_behaved(bystander, k, seed=99)
        publisher.unpublish(name)
        r.free()
        await publisher.sync()
        await bystander.sync()
    await wait_for_memory(address, baseline)
    private_daemon.assert_alive()


# --------------------------------------------------------------------------- names


async def test_a_name_is_published_once(address: str) -> None:
    name = _name("once")
    async with gpud_client.connect(address) as one, gpud_client.connect(address) as two:
        a = one.tensor(np.ones(4, dtype=np.float32))
        b = one.tensor(np.zeros(4, dtype=np.float32))
        c = two.tensor(np.zeros(4, dtype=np.float32))
        one.publish(a, name)
        await one.sync()
        one.publish(b, name)
        bad_seq = last_seq(one)
        with pytest.raises(AlreadyExists) as info:
            await one.sync()
        assert (info.value.op, info.value.seq) == ("publish", bad_seq)
        two.publish(c, name)  # from another session too
        with pytest.raises(AlreadyExists):
            await two.sync()
        r = await two.open(name)
        np.testing.assert_array_equal(await r.numpy(), np.ones(4, dtype=np.float32))  # still the first
        one.unpublish(name)
        await one.sync()
        two.publish(c, name)  # free again
        await two.sync()
        r2 = await one.open(name)
        np.testing.assert_array_equal(await r2.numpy(), np.zeros(4, dtype=np.float32))
        two.unpublish(name)
        await two.sync()


@pytest.mark.parametrize(
    "bad",
    ["", "has space", "x" * 129, "tab\there", "new\nline", "semi;colon", "star*", "caf\u00e9", "back\\slash"],
    ids=["empty", "space", "too-long", "tab", "newline", "semicolon", "star", "non-ascii", "backslash"],
)
async def test_bad_names_are_invalid(gpu: Client, bad: str) -> None:
    t = gpu.tensor(np.ones(4, dtype=np.float32))
    gpu.publish(t, bad)
    bad_seq = last_seq(gpu)
    with pytest.raises(InvalidArgument) as info:
        await gpu.sync()
    assert (info.value.op, info.value.seq) == ("publish", bad_seq)
    with pytest.raises(InvalidArgument) as info:
        await gpu.open(bad)
    assert info.value.op == "open"
    gpu.unpublish(bad)
    with pytest.raises(InvalidArgument) as info:
        await gpu.sync()
    assert info.value.op == "unpublish"
    np.testing.assert_array_equal(await t.numpy(), np.ones(4, dtype=np.float32))  # the session goes on


@pytest.mark.parametrize("good", ["y" * 128, "ns:model/v1.2_enc-out", "..", "a/../b", "-"])
async def test_names_the_protocol_allows(gpu: Client, good: str) -> None:
    """Letters, digits and `_.:/-`, 1 to 128 of them; dots are plain characters, not path steps."""
    t = gpu.tensor(np.arange(4, dtype=np.float32))
    gpu.publish(t, good)
    await gpu.sync()
    r = await gpu.open(good)
    np.testing.assert_array_equal(await r.numpy(), np.arange(4, dtype=np.float32))
    gpu.unpublish(good)
    await gpu.sync()
    with pytest.raises(NotFound):
        await gpu.open(good)


async def test_bad_mode_is_invalid(gpu: Client) -> None:
    t = gpu.tensor(np.ones(4, dtype=np.float32))
    name = _name("mode")
    gpu.publish(t, name, "wo")
    with pytest.raises(InvalidArgument) as info:
        await gpu.sync()
    assert info.value.op == "publish"
    with pytest.raises(NotFound):  # nothing was published
        await gpu.open(name)


async def test_only_the_publisher_unpublishes_a_read_only_name_while_connected(address: str) -> None:
    name = _name("guarded")
    async with gpud_client.connect(address) as publisher:
        publisher.publish(publisher.tensor(np.ones(8, dtype=np.float32)), name, "ro")
        await publisher.flush()
        async with gpud_client.connect(address) as reader:
            reader.unpublish(name)
            with pytest.raises(PermissionDenied) as denied:
                await reader.flush()
            assert denied.value.op == "unpublish"
            await reader.open(name)  # still there
        rw_name = _name("shared-rw")
        publisher.publish(publisher.tensor(np.ones(8, dtype=np.float32)), rw_name, "rw")
        await publisher.flush()
        async with gpud_client.connect(address) as other:
            other.unpublish(rw_name)  # read-write: anyone may
            await other.flush()
            with pytest.raises(NotFound):
                await other.open(rw_name)
    async with gpud_client.connect(address) as reader:  # the publisher is gone: cleanup is allowed
        reader.unpublish(name)
        await reader.flush()
        with pytest.raises(NotFound):
            await reader.open(name)

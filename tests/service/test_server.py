"""The daemon against a raw ZeroMQ peer speaking the protocol by hand (and badly).

Every bad input must get a clear error reply, and the daemon must keep serving a well-behaved
client at the same time.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import anyio
import msgpack
import numpy as np
import pytest
from rawpeer import F32, I32, TENSOR, U32, RawPeer, raw_batch
from support import (
    BAD_ENTRY,
    BAD_SOURCE,
    BAD_SYMBOL,
    Daemon,
    assert_close,
    axpb,
    check_well_behaved,
    device_memory,
    ref_axpb,
    run_axpb,
    wait_for_memory,
)

import gpud_client
import gpud_protocol as proto
from gpud.testing import spawn
from gpud.testing import workloads as kernels
from gpud_protocol import ErrorCode, Opcode

# --------------------------------------------------------------------------- before a session


@pytest.mark.parametrize(
    "frames",
    [
        [b"\xc1\xc1\xc1"],
        [b"garbage that is not msgpack at all"],
        [b""],
        [msgpack.packb({"t": "hello", "v": 1, "name": "x", "pid": 1})[:-3]],  # truncated
        [msgpack.packb([1, 2, 3])],
        [msgpack.packb({"t": "what-is-this"})],
        [msgpack.packb({1: 2})],
        [msgpack.packb({"t": "ping", "x": msgpack.ExtType(3, b"abc")})],
        [msgpack.packb({"t": "ping", "x": b"bin"}, use_bin_type=True)],
        [proto.encode_hello("x", 1), b"extra frame"],
        [proto.PING, b"extra"],
    ],
    ids=[
        "c1",
        "text",
        "empty",
        "truncated",
        "array",
        "unknown-type",
        "int-key",
        "ext",
        "bin",
        "hello-with-frame",
        "ping-with-frame",
    ],
)
async def test_malformed_messages_get_a_protocol_error(
    raw: RawPeer, gpu: gpud_client.Client, frames: list[bytes]
) -> None:
    await raw.send(*frames)
    error = await raw.error()
    assert error["code"] == ErrorCode.PROTOCOL
    await check_well_behaved(gpu)


async def test_oversized_header(raw: RawPeer, gpu: gpud_client.Client) -> None:
    await raw.send(msgpack.packb({"t": "ping", "pad": "x" * (proto.DEFAULT_LIMITS.max_header_bytes + 10)}))
    error = await raw.error()
    assert error["code"] == ErrorCode.PROTOCOL and "too large" in error["msg"]
    await check_well_behaved(gpu)


async def test_batch_and_ping_without_hello(raw: RawPeer, gpu: gpud_client.Client) -> None:
    await raw.batch([[Opcode.READBACK, 1, 1]])
    error = await raw.error()
    assert error["code"] == ErrorCode.SESSION and "hello" in error["msg"]
    await raw.send(proto.PING)
    assert (await raw.error())["code"] == ErrorCode.SESSION
    await check_well_behaved(gpu)


async def test_wrong_protocol_version(raw: RawPeer, gpu: gpud_client.Client) -> None:
    header = await raw.hello(version=proto.PROTOCOL_VERSION + 41)
    assert header["t"] == "error" and header["code"] == ErrorCode.PROTOCOL
    assert "version" in header["msg"]
    await raw.batch([[Opcode.SYNC, 1]])  # still no session
    assert (await raw.error())["code"] == ErrorCode.SESSION
    welcome = await raw.hello()  # the right version then works on the same socket
    assert welcome["t"] == "welcome" and welcome["v"] == proto.PROTOCOL_VERSION
    await check_well_behaved(gpu)


async def test_bye_ends_the_session(raw: RawPeer) -> None:
    assert (await raw.hello())["t"] == "welcome"
    await raw.send(proto.PING)
    assert (await raw.recv())[0] == {"t": "pong"}
    await raw.send(proto.BYE)
    await raw.batch([[Opcode.SYNC, 1]])
    assert (await raw.error())["code"] == ErrorCode.SESSION


# --------------------------------------------------------------------------- inside a session


async def test_raw_happy_path(raw: RawPeer) -> None:
    """The protocol by hand: alloc, upload, kernel, dispatch, readback, stats, free."""
    assert (await raw.hello())["t"] == "welcome"
    data = np.arange(100, dtype=np.float32)
    source, options = kernels.axpb_source(await _backend(raw))
    s = [raw.next_seq() for _ in range(8)]
    kernel_options = {k: list(v) for k, v in options.items()}  # type: ignore[call-overload]
    await raw.batch(
        [
            [Opcode.ALLOC, s[0], 1, "float32", [100], 0],
            [Opcode.ALLOC, s[1], 2, "float32", [100], 0],
            [Opcode.UPLOAD, s[2], 1, 0, data.nbytes],
            [Opcode.KERNEL, s[3], 3, source, "axpb", kernel_options],
            [Opcode.DISPATCH, s[4], 3, [2, 1, 1], [[TENSOR, 1], [TENSOR, 2], [F32, 3.0], [F32, 1.0], [U32, 100]], None],
            [Opcode.READBACK, s[5], 2],
            [Opcode.STATS, s[6]],
            [Opcode.FREE, s[7], 1],
        ],
        [data.tobytes()],
    )
    kernel_reply, _ = await raw.reply(s[3])
    assert kernel_reply["ok"] is True
    header, frames = await raw.reply(s[5])
    assert header["ok"] is True and header["n"] == 400
    np.testing.assert_array_equal(np.frombuffer(frames[0], np.float32), data * 3 + 1)
    stats, _ = await raw.reply(s[6])
    assert stats["stats"]["session"]["handles"] == 2


async def _backend(raw: RawPeer) -> str:
    seq = raw.next_seq()
    await raw.batch([[Opcode.STATS, seq]])
    header, _ = await raw.reply(seq)
    return str(header["stats"]["device"]["backend"])


async def test_wrong_frame_counts(raw: RawPeer, gpu: gpud_client.Client) -> None:
    await raw.hello()
    s = raw.next_seq()
    await raw.batch([[Opcode.ALLOC, s, 1, "uint8", [4], 0]])
    # The header announces two payload frames but the message carries one ...
    await raw.send(raw_batch([[Opcode.UPLOAD, raw.next_seq(), 1, 0, 4]], 2), b"abcd")
    assert (await raw.error())["code"] == ErrorCode.PROTOCOL
    # ... or none, or one that no op uses.
    await raw.send(raw_batch([[Opcode.UPLOAD, raw.next_seq(), 1, 0, 4]], 1))
    assert (await raw.error())["code"] == ErrorCode.PROTOCOL
    await raw.send(raw_batch([], 1), b"abcd")
    assert (await raw.error())["code"] == ErrorCode.PROTOCOL
    # Too many frames for the limit.
    count = proto.DEFAULT_LIMITS.max_frames + 1
    await raw.send(raw_batch([], count), *[b"x"] * count)
    assert (await raw.error())["code"] == ErrorCode.PROTOCOL
    # The session is fine: none of those batches ran.
    header, frames = await raw.readback(1)
    assert header["ok"] is True and len(frames[0]) == 4
    await check_well_behaved(gpu)


async def test_frame_shorter_than_declared(raw: RawPeer, gpu: gpud_client.Client) -> None:
    await raw.hello()
    a, up, rb = raw.next_seq(), raw.next_seq(), raw.next_seq()
    await raw.batch(
        [[Opcode.ALLOC, a, 1, "float32", [4], 0], [Opcode.UPLOAD, up, 1, 0, 16], [Opcode.READBACK, rb, 1]],
        [b"\x00" * 8],
    )
    code, message, failed_seq, op = await raw.failed(rb)
    assert (code, failed_seq, op) == (ErrorCode.INVALID_ARGUMENT, up, "upload")
    assert "8 bytes" in message
    header, _ = await raw.readback(1, ack=up)
    assert header["ok"] is True
    await check_well_behaved(gpu)


async def test_upload_size_differs_from_the_tensor(raw: RawPeer, gpu: gpud_client.Client) -> None:
    """The frame matches the op, but not the tensor's dtype and shape."""
    await raw.hello()
    a, up, rb = raw.next_seq(), raw.next_seq(), raw.next_seq()
    await raw.batch(
        [[Opcode.ALLOC, a, 1, "float32", [4], 0], [Opcode.UPLOAD, up, 1, 0, 12], [Opcode.READBACK, rb, 1]],
        [b"\x01" * 12],
    )
    code, message, failed_seq, op = await raw.failed(rb)
    assert (code, failed_seq, op) == (ErrorCode.INVALID_ARGUMENT, up, "upload")
    assert "12" in message and "16" in message
    await check_well_behaved(gpu)


async def test_sticky_error_until_acknowledged(raw: RawPeer) -> None:
    await raw.hello()
    a = raw.next_seq()
    await raw.batch([[Opcode.ALLOC, a, 1, "int32", [2], 0]])
    bad = raw.next_seq()
    await raw.batch([[Opcode.FREE, bad, 99]])  # fails, no reply of its own
    for _ in range(3):  # every later request fails with it until it is acknowledged
        seq = raw.next_seq()
        await raw.batch([[Opcode.READBACK, seq, 1]])
        code, _message, failed_seq, op = await raw.failed(seq)
        assert (code, failed_seq, op) == (ErrorCode.NOT_FOUND, bad, "free")
    seq = raw.next_seq()
    await raw.batch([[Opcode.SYNC, seq]], ack=bad - 1)  # an older ack does not clear it
    assert (await raw.failed(seq))[2] == bad
    header, frames = await raw.readback(1, ack=bad)
    assert header["ok"] is True and len(frames[0]) == 8


@pytest.mark.parametrize(
    ("op", "code"),
    [
        ([Opcode.READBACK, None, 12345], ErrorCode.NOT_FOUND),
        ([Opcode.FREE, None, 12345], ErrorCode.NOT_FOUND),
        ([Opcode.COPY, None, 12345, 1], ErrorCode.NOT_FOUND),
        ([Opcode.DISPATCH, None, 777, [1, 1, 1], [[TENSOR, 1]], None], ErrorCode.NOT_FOUND),
        ([Opcode.ALLOC, None, 2, "float128", [4], 0], ErrorCode.INVALID_ARGUMENT),
        ([Opcode.ALLOC, None, 2, "object", [4], 0], ErrorCode.INVALID_ARGUMENT),
        ([Opcode.ALLOC, None, 2, [], [4], 0], ErrorCode.INVALID_ARGUMENT),  # once crashed the daemon
        ([Opcode.ALLOC, None, 2, {"a": 1}, [4], 0], ErrorCode.INVALID_ARGUMENT),
        ([Opcode.ALLOC, None, 2, "float32", [1] * 9, 0], ErrorCode.INVALID_ARGUMENT),
        ([Opcode.ALLOC, None, 2, "float32", [1 << 35], 0], ErrorCode.INVALID_ARGUMENT),  # past max_tensor_bytes
        ([Opcode.ALLOC, None, 1, "float32", [4], 0], ErrorCode.INVALID_ARGUMENT),  # handle 1 is in use
        ([Opcode.ALLOC, None, 0, "float32", [4], 0], ErrorCode.INVALID_ARGUMENT),
        ([Opcode.DISPATCH, None, 1, [1, 1, 1], [[9, 1]], None], ErrorCode.INVALID_ARGUMENT),
        ([Opcode.DISPATCH, None, 1, [1, 1], [], None], ErrorCode.INVALID_ARGUMENT),
        ([Opcode.DISPATCH, None, 1, [1, 1, 1], [[U32, -1]], None], ErrorCode.INVALID_ARGUMENT),
        ([Opcode.DISPATCH, None, 1, [1, 1, 1], [[I32, 1 << 40]], None], ErrorCode.INVALID_ARGUMENT),
        ([Opcode.KERNEL, None, 5, "", "main", {}], ErrorCode.INVALID_ARGUMENT),
        ([Opcode.KERNEL, None, 5, "x", "main", {"nope": 1}], ErrorCode.INVALID_ARGUMENT),
        ([Opcode.PUBLISH, None, 1, "bad name!", "ro"], ErrorCode.INVALID_ARGUMENT),
        ([Opcode.PUBLISH, None, 1, "ok-name", "rx"], ErrorCode.INVALID_ARGUMENT),
        ([Opcode.UNPUBLISH, None, "test/never-published"], ErrorCode.NOT_FOUND),
        ([Opcode.COPY, None, 1, 1, 1], ErrorCode.INVALID_ARGUMENT),
        ([99, None, 1, 2, 3], ErrorCode.PROTOCOL),
    ],
)
async def test_bad_op_is_reported_against_its_seq(
    raw: RawPeer, gpu: gpud_client.Client, op: list[Any], code: ErrorCode
) -> None:
    await raw.hello()
    await raw.batch([[Opcode.ALLOC, raw.next_seq(), 1, "float32", [4], 0]])
    op = list(op)
    op[1] = bad = raw.next_seq()
    rb = raw.next_seq()
    await raw.batch([op, [Opcode.READBACK, rb, 1]])
    if op[0] in proto.REQUEST_OPCODES:  # a request that fails is answered itself, and nothing more
        got_code, message, failed_seq, _name = await raw.failed(bad)
        assert (got_code, failed_seq) == (code, bad), message
        header, _ = await raw.reply(rb)
        assert header["ok"] is True
    else:  # other ops are reported on the next request, until acknowledged
        got_code, message, failed_seq, _name = await raw.failed(rb)
        assert (got_code, failed_seq) == (code, bad), message
        header, _ = await raw.readback(1, ack=bad)
        assert header["ok"] is True
    await check_well_behaved(gpu)


async def test_requests_that_fail_are_answered_directly(raw: RawPeer, gpu: gpud_client.Client) -> None:
    await raw.hello()
    open_seq = raw.next_seq()
    await raw.batch([[Opcode.OPEN, open_seq, 5, "test/no-such-resident"]])
    code, _message, failed_seq, op = await raw.failed(open_seq)
    assert (code, failed_seq, op) == (ErrorCode.NOT_FOUND, open_seq, "open")
    rb = raw.next_seq()
    await raw.batch([[Opcode.READBACK, rb, 4242]], ack=open_seq)
    code, _message, failed_seq, op = await raw.failed(rb)
    assert (code, failed_seq, op) == (ErrorCode.NOT_FOUND, rb, "readback")
    await check_well_behaved(gpu)


async def test_kernel_that_fails_to_compile(raw: RawPeer, gpu: gpud_client.Client) -> None:
    await raw.hello()
    backend = await _backend(raw)
    options = {"block": [64, 1, 1]} if backend == "cuda" else {}
    seq = raw.next_seq()
    await raw.batch([[Opcode.KERNEL, seq, 1, BAD_SOURCE[backend], BAD_ENTRY, options]])
    code, message, failed_seq, op = await raw.failed(seq)
    assert (code, failed_seq, op) == (ErrorCode.COMPILE, seq, "kernel")
    assert BAD_SYMBOL in message
    # The kernel handle was not taken: dispatching it is NOT_FOUND, registering it again works.
    d, rb = raw.next_seq(), raw.next_seq()
    await raw.batch([[Opcode.DISPATCH, d, 1, [1, 1, 1], [], None], [Opcode.SYNC, rb]], ack=seq)
    code, _message, failed_seq, _op = await raw.failed(rb)
    assert (code, failed_seq) == (ErrorCode.NOT_FOUND, d)
    source, opts = kernels.axpb_source(backend)
    seq2 = raw.next_seq()
    await raw.batch([[Opcode.KERNEL, seq2, 1, source, "axpb", {k: list(v) for k, v in opts.items()}]], ack=d)  # type: ignore[call-overload]
    assert (await raw.reply(seq2))[0]["ok"] is True
    await check_well_behaved(gpu)


async def test_bad_dispatch_args_for_a_real_kernel(raw: RawPeer, gpu: gpud_client.Client) -> None:
    await raw.hello()
    backend = await _backend(raw)
    source, opts = kernels.axpb_source(backend)
    k = raw.next_seq()
    await raw.batch(
        [
            [Opcode.ALLOC, raw.next_seq(), 1, "float32", [64], 0],
            [Opcode.ALLOC, raw.next_seq(), 2, "float32", [64], 0],
            [Opcode.KERNEL, k, 9, source, "axpb", {k: list(v) for k, v in opts.items()}],  # type: ignore[call-overload]
        ]
    )
    assert (await raw.reply(k))[0]["ok"] is True
    ack = None
    for args in (
        [[TENSOR, 1], [TENSOR, 2]],  # too few
        [[TENSOR, 1], [F32, 1.0], [F32, 1.0], [F32, 1.0], [U32, 64]],  # a scalar for a tensor
        [[TENSOR, 1], [TENSOR, 2], [F32, 1.0], [F32, 1.0], [U32, 64], [TENSOR, 1], [TENSOR, 2]],  # too many
    ):
        d, s = raw.next_seq(), raw.next_seq()
        await raw.batch([[Opcode.DISPATCH, d, 9, [1, 1, 1], args, None], [Opcode.SYNC, s]], ack=ack)
        code, _message, failed_seq, op = await raw.failed(s)
        assert (code, failed_seq, op) == (ErrorCode.INVALID_ARGUMENT, d, "dispatch")
        ack = d
    d, s = raw.next_seq(), raw.next_seq()
    grid = [1, 1 << 20, 1]  # past every device's limit for y
    await raw.batch(
        [
            [Opcode.DISPATCH, d, 9, grid, [[TENSOR, 1], [TENSOR, 2], [F32, 1.0], [F32, 1.0], [U32, 64]], None],
            [Opcode.SYNC, s],
        ],
        ack=ack,
    )
    code, _message, failed_seq, _op = await raw.failed(s)
    assert (code, failed_seq) == (ErrorCode.INVALID_ARGUMENT, d)
    s = raw.next_seq()
    await raw.batch([[Opcode.SYNC, s]], ack=d)
    assert (await raw.reply(s))[0]["ok"] is True
    await check_well_behaved(gpu)


# --------------------------------------------------------------------------- all at once


async def test_abuse_while_a_good_client_works(address: str, daemon: Daemon) -> None:
    """A good client's chain runs while a raw peer throws every bad input at the daemon."""
    done = anyio.Event()
    results: list[bool] = []

    async def good() -> None:
        async with gpud_client.connect(address) as gpu:
            k = await axpb(gpu)
            rng = np.random.default_rng(77)
            while not done.is_set() or not results:
                x = rng.standard_normal(999).astype(np.float32)
                bufs = [gpu.tensor(x), gpu.empty(999)]
                ref = x
                for i in range(30):
                    run_axpb(gpu, k, bufs[i % 2], bufs[(i + 1) % 2], 0.99, 0.01)
                    ref = ref_axpb(ref, 0.99, 0.01)
                assert_close(await bufs[0].numpy(), ref)
                results.append(True)
                for t in bufs:
                    t.free()

    async def abuse() -> None:
        peers = [RawPeer(address) for _ in range(3)]
        try:
            bad_messages: list[list[bytes]] = [
                [b"\x00\xff garbage"],
                [b""],
                [msgpack.packb({"t": "batch", "ops": [[1, 1, 1, [], [2]]], "nf": 0, "ack": None})],
                [msgpack.packb({"t": "hello", "v": 999, "name": "x", "pid": 1})],
                [msgpack.packb({"t": "nope"})],
                [raw_batch([[Opcode.UPLOAD, 1, 1, 0, 99]], 1), b"short"],
            ]
            for peer in peers:
                for frames in bad_messages:
                    await peer.send(*frames)
                    await peer.error()
            for peer in peers:
                await peer.hello()
                s = [peer.next_seq() for _ in range(5)]
                await peer.batch(
                    [
                        [Opcode.ALLOC, s[0], 1, "float32", [1 << 35], 0],  # past max_tensor_bytes
                        [Opcode.ALLOC, s[1], 2, [], [3], 0],
                        [Opcode.DISPATCH, s[2], 5, [1, 1, 1], [[TENSOR, 2]], None],
                        [Opcode.UPLOAD, s[3], 1, 0, 3],
                        [Opcode.READBACK, s[4], 1],
                    ],
                    [b"abc"],
                )
                assert (await peer.failed(s[4]))[2] == s[0]
        finally:
            for peer in peers:
                peer.close()
            done.set()

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(good)
            tg.start_soon(abuse)
    assert results
    daemon.assert_alive()
    async with gpud_client.connect(address) as gpu:
        await check_well_behaved(gpu, seed=5)


# --------------------------------------------------------------------------- sessions that vanish


async def test_vanished_session_is_released_after_its_lease(private_daemon: Daemon) -> None:
    """A client that disappears without bye: its lease expires and its memory comes back."""
    address = private_daemon.address
    baseline = await device_memory(address)
    peer = RawPeer(address)
    try:
        await peer.hello()
        await peer.batch(
            [
                [Opcode.ALLOC, peer.next_seq(), 1, "float32", [1 << 18], 0],
                [Opcode.ALLOC, peer.next_seq(), 2, "uint8", [5], 0],
            ]
        )
        seq = peer.next_seq()
        await peer.batch([[Opcode.SYNC, seq]])
        await peer.reply(seq)
        assert (await device_memory(address))["memory_in_use"] >= baseline["memory_in_use"] + (1 << 20)
    finally:
        peer.close()  # no bye, no more heartbeats
    await wait_for_memory(address, baseline, timeout=20)
    private_daemon.assert_alive()


async def test_vanished_session_is_released_while_nobody_else_talks(private_daemon: Daemon) -> None:
    """An idle daemon still expires leases: the socket is empty, so silence proves the client gone."""
    address = private_daemon.address
    baseline = await device_memory(address)
    peer = RawPeer(address)
    try:
        await peer.hello()
        seq = peer.next_seq()
        await peer.batch([[Opcode.ALLOC, peer.next_seq(), 1, "float32", [1 << 18], 0], [Opcode.SYNC, seq]])
        await peer.reply(seq)
    finally:
        peer.close()
    await anyio.sleep(3)  # lease 1 s; no message reaches the daemon meanwhile
    now = await device_memory(address)  # the first request after the silence: already released
    assert (now["memory_in_use"], now["live_buffers"]) == (baseline["memory_in_use"], baseline["live_buffers"])


async def test_session_limits_from_a_config_file() -> None:
    """Per-session quota (OUT_OF_MEMORY) and request window (BUSY) are enforced with clear errors."""
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "gpud.toml"
        config.write_text("[gpud]\nsession_memory_bytes = 1048576\nsession_max_requests = 4\n")
        with spawn.daemon("webgpu", extra_args=("--config", str(config))) as (address, proc):
            peer = RawPeer(address)
            try:
                await peer.hello()
                big, rb = peer.next_seq(), peer.next_seq()
                await peer.batch([[Opcode.ALLOC, big, 1, "uint8", [(1 << 20) + 1], 0], [Opcode.READBACK, rb, 1]])
                code, message, failed_seq, op = await peer.failed(rb)
                assert (code, failed_seq, op) == (ErrorCode.OUT_OF_MEMORY, big, "alloc")
                assert "quota" in message
                seqs = [peer.next_seq() for _ in range(10)]
                await peer.batch(
                    [[Opcode.ALLOC, peer.next_seq(), 2, "uint8", [4], 0]] + [[Opcode.READBACK, s, 2] for s in seqs],
                    ack=big,
                )
                replies = {s: (await peer.reply(s))[0] for s in seqs}
                assert set(replies) == set(seqs)
                assert [replies[s]["ok"] for s in seqs[:4]] == [True] * 4
                busy = [replies[s] for s in seqs[4:]]
                assert all(not h["ok"] and h["err"][0] == ErrorCode.BUSY for h in busy)
            finally:
                peer.close()
            async with gpud_client.connect(address) as gpu:
                await check_well_behaved(gpu)
            assert proc.poll() is None


# --------------------------------------------------------------------------- back-pressure


async def test_a_flooding_client_is_throttled_and_nobody_starves() -> None:
    """With one submission allowed in flight, the daemon stops reading while the device is behind;
    a client that queues thousands of dispatches without awaiting still gets correct results, and
    another client keeps working meanwhile."""
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "gpud.toml"
        config.write_text("[gpud]\nmax_submissions_in_flight = 1\nmax_dispatches_per_flush = 8\n")
        with spawn.daemon("webgpu", extra_args=("--config", str(config))) as (address, proc):
            async with gpud_client.connect(address) as flood, gpud_client.connect(address) as other:
                k = await axpb(flood)
                n = 256
                x = np.random.default_rng(9).standard_normal(n).astype(np.float32)
                bufs = [flood.tensor(x), flood.empty(n)]
                steps = 3000
                for i in range(steps):  # no await: batches go out as they fill
                    run_axpb(flood, k, bufs[i % 2], bufs[(i + 1) % 2], 1.0, 0.001)
                for seed in range(3):
                    await check_well_behaved(other, seed=seed)
                got = await bufs[steps % 2].numpy()
                want = x
                for _ in range(steps):
                    want = want + np.float32(0.001)
                assert_close(got, want)
                stats = await flood.stats()
                assert stats["device"]["dispatches"] >= steps
                assert stats["device"]["throttle_waits"] > 0  # the daemon did stop reading
            assert proc.poll() is None


# --------------------------------------------------------------------------- tcp


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_plain_tcp_is_refused_without_the_insecure_flag() -> None:
    import subprocess
    import sys

    address = f"tcp://127.0.0.1:{_free_port()}"
    run = subprocess.run(
        [sys.executable, "-m", "gpud", "serve", "--address", address, "--backend", "webgpu"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2
    assert "CURVE" in run.stderr and "--insecure-tcp" in run.stderr


async def test_tcp_with_curve_keys(tmp_path: Path) -> None:
    import zmq.auth

    server_public, server_secret = zmq.auth.create_certificates(str(tmp_path), "server")
    address = f"tcp://127.0.0.1:{_free_port()}"
    args = ("--curve-secret-key", server_secret)
    public, _secret = zmq.auth.load_certificate(server_public)
    assert public is not None
    with spawn.daemon("webgpu", address=address, extra_args=args, server_public_key=public) as (_address, proc):
        async with gpud_client.connect(address, server_public_key=public) as gpu:
            await check_well_behaved(gpu)
        with pytest.raises(gpud_client.DaemonLost):  # no key: the CURVE handshake never completes
            async with gpud_client.connect(address, timeout=1.0):
                pass
        assert proc.poll() is None

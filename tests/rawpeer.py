"""A raw ZeroMQ peer that speaks the protocol by hand (and badly, when a test wants it to)."""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

import anyio
import msgpack
import zmq
import zmq.asyncio

import gpud_protocol as proto
from gpud_protocol import Opcode

TENSOR, F32, I32, U32 = (
    int(k) for k in (proto.ArgKind.TENSOR, proto.ArgKind.F32, proto.ArgKind.I32, proto.ArgKind.U32)
)


def raw_batch(ops: list[list[Any]], n_frames: int) -> bytes:
    return proto.encode_batch(b"".join(msgpack.packb(op) for op in ops), len(ops), n_frames)


class RawPeer:
    """A DEALER socket and the protocol spoken by hand."""

    def __init__(self, address: str) -> None:
        self.ctx = zmq.asyncio.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(address)
        self.seq = 0
        self.early: dict[int, tuple[dict[str, Any], list[bytes]]] = {}

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    async def send(self, *frames: bytes) -> None:
        await self.sock.send_multipart(list(frames))

    async def recv(self, timeout: float = 20.0) -> tuple[dict[str, Any], list[bytes]]:
        with anyio.fail_after(timeout):
            frames = await self.sock.recv_multipart()
        header, payload = proto.decode_server_message(frames, proto.DEFAULT_LIMITS)
        return header, [bytes(f) for f in payload]

    async def hello(self, version: int = proto.PROTOCOL_VERSION) -> dict[str, Any]:
        await self.send(msgpack.packb({"t": "hello", "v": version, "name": "raw-test", "pid": os.getpid()}))
        header, _ = await self.recv()
        return header

    async def batch(self, ops: list[list[Any]], frames: list[bytes] = (), ack: int | None = None) -> None:  # type: ignore[assignment]
        frames = list(frames)
        packed = b"".join(msgpack.packb(op) for op in ops)
        await self.send(proto.encode_batch(packed, len(ops), len(frames), None if ack is None else [ack]), *frames)

    async def error(self) -> dict[str, Any]:
        """The next message, which must be an unattributable error."""
        header, _ = await self.recv()
        assert header["t"] == "error", header
        assert isinstance(header["msg"], str) and header["msg"]
        return header

    async def reply(self, seq: int) -> tuple[dict[str, Any], list[bytes]]:
        """The reply to request `seq` (replies come in completion order, not request order)."""
        while seq not in self.early:
            header, frames = await self.recv()
            assert header["t"] == "reply", header
            self.early[header["seq"]] = (header, frames)
        return self.early.pop(seq)

    async def failed(self, seq: int) -> tuple[int, str, int, str]:
        """The reply to request `seq`, which must be an error: (code, message, failed_seq, op)."""
        header, _ = await self.reply(seq)
        assert header["ok"] is False, header
        code, message, failed_seq, op = header["err"]
        assert isinstance(message, str) and message
        return code, message, failed_seq, op

    async def readback(self, handle: int, ack: int | None = None) -> tuple[dict[str, Any], list[bytes]]:
        seq = self.next_seq()
        await self.batch([[Opcode.READBACK, seq, handle]], ack=ack)
        return await self.reply(seq)

    def close(self) -> None:
        self.sock.close(linger=0)
        self.ctx.term()


# argv: address, seconds, kind. Sends as fast as it can for `seconds`, prints "flooded N", then holds
# its socket open (never reading it) until stdin closes.
_FLOODER = """
import os, sys, time
import msgpack, zmq

address, seconds, kind = sys.argv[1], float(sys.argv[2]), sys.argv[3]
status = msgpack.packb({"t": "status"})
junk = [b"\\xc1 garbage", os.urandom(200), msgpack.packb({"t": "nope"}), msgpack.packb({"t": "ping"}),
        msgpack.packb({"t": "hello", "v": 999, "name": "flood", "pid": 1})]
messages = [status] if kind == "status" else junk if kind == "garbage" else [status, *junk]
ctx = zmq.Context()
sock = ctx.socket(zmq.DEALER)
sock.setsockopt(zmq.LINGER, 0)
sock.setsockopt(zmq.SNDHWM, 100_000)
sock.setsockopt(zmq.RCVHWM, 1)  # replies back up into the daemon as soon as the kernel's buffers are full
sock.connect(address)
print("ready", flush=True)
sent, end = 0, time.monotonic() + seconds
while time.monotonic() < end:
    for _ in range(100):
        try:
            sock.send(messages[sent % len(messages)], flags=zmq.NOBLOCK)
            sent += 1
        except zmq.Again:
            break
print("flooded", sent, flush=True)
sys.stdin.readline()
"""


class Flooder:
    """A peer without a session, in a process of its own (so it floods as fast as Python can, whatever
    the test's event loop does), that sends `kind` ("status", "garbage" or "mixed") for `seconds` and
    never reads its socket. `flooded()` waits for the end of the flood; the socket stays open until `close()`."""

    def __init__(self, address: str, seconds: float, kind: str) -> None:
        self.args = (address, str(seconds), kind)
        self.proc: asyncio.subprocess.Process | None = None
        self._done: asyncio.Future[bytes] | None = None

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _FLOODER, *self.args, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
        )
        assert self.proc.stdout is not None
        assert await self.proc.stdout.readline() == b"ready\n"
        self._done = asyncio.ensure_future(self.proc.stdout.readline())

    def flooding(self) -> bool:
        return self._done is not None and not self._done.done()

    async def flooded(self) -> int:
        """The number of messages sent, once the flood is over."""
        assert self._done is not None
        return int((await self._done).split()[1])

    async def close(self) -> None:
        if self.proc is None:
            return
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), 10)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
        if self._done is not None and not self._done.done():
            self._done.cancel()

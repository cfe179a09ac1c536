"""The async client: ops queue here and travel as one message when something is awaited.

    async with gpud_client.connect() as gpu:
        k = await gpu.kernel(wgsl_source, entry="main")
        x = gpu.tensor(np_array); y = gpu.empty((n,), "float32")
        gpu.dispatch(k, grid=(n // 64, 1, 1), args=[x, y, 2.0])   # queued, no round trip
        out = await y.numpy()                                      # flush + readback

One reader task per socket resolves futures by sequence number, so a cancelled await never loses
another reply. Every future resolves: with data, or with an error (DaemonLost when the daemon
stops answering or goes away).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import os
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import anyio
import msgpack
import numpy as np
import zmq
from zmq.utils.monitor import parse_monitor_message

import gpud_protocol as proto
from gpud_client.errors import DaemonLost, GpudError, InvalidArgument, ProtocolError, from_code
from gpud_client.zmqio import SocketReader
from gpud_protocol import ArgKind, Opcode

HANDSHAKE_TIMEOUT_S = 10.0
SEND_QUEUE_MESSAGES = 64  # batches queued in ZeroMQ before the client holds them for the next await


def default_address() -> str:
    """`GPUD_ADDRESS`, else ipc:// in $XDG_RUNTIME_DIR/gpud (or /run/gpud for root); as the daemon."""
    if address := os.environ.get("GPUD_ADDRESS"):
        return address
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(runtime) if runtime and os.geteuid() != 0 else Path("/run")
    return f"ipc://{base / 'gpud' / 'gpud.sock'}"


class Scalar(NamedTuple):
    kind: int  # an ArgKind
    value: int | float


_TENSOR, _F32, _I32, _U32 = (int(k) for k in (ArgKind.TENSOR, ArgKind.F32, ArgKind.I32, ArgKind.U32))
_DISPATCH = int(Opcode.DISPATCH)
_DISPATCH_PREFIX = bytes([0x96]) + msgpack.packb(_DISPATCH)  # a msgpack array of 6, then the opcode
DISPATCH_BODY_CACHE = 4096  # distinct dispatches whose packed bytes a client keeps


def f32(value: float) -> Scalar:
    return Scalar(_F32, float(value))


def i32(value: int) -> Scalar:
    return Scalar(_I32, int(value))


def u32(value: int) -> Scalar:
    return Scalar(_U32, int(value))


class Trace(NamedTuple):
    """perf_counter stamps of one readback (same clock in every process of a host)."""

    sent: float  # client: batch handed to ZeroMQ
    received: float  # daemon: message read from the socket
    executed: float  # daemon: the readback's copy encoded
    flushed: float  # daemon: the command buffer submitted
    completed: float  # daemon: the copy completed, reply about to be sent
    replied: float  # client: reply read from the socket
    resumed: float  # client: the awaiting task resumed


class Kernel(NamedTuple):
    handle: int
    entry: str
    writes: tuple[int, ...] | None  # tensor-argument positions the kernel writes, as the daemon sees it


class Tensor:
    """A device tensor owned by a session (or opened from a resident name)."""

    def __init__(
        self, client: Client, handle: int, dtype: np.dtype[Any], shape: tuple[int, ...], mode: str = "rw"
    ) -> None:
        self._client = client
        self.handle = handle
        self.dtype = dtype
        self.shape = shape
        self.mode = mode
        self.freed = False
        self._wire = (_TENSOR, handle)  # as a dispatch argument

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    async def numpy(self) -> np.ndarray[Any, Any]:
        """Flush queued work and read the tensor back."""
        _header, frames = await self._client._request(Opcode.READBACK, self._client._arg(self)[1])
        data = frames[0].buffer if frames else b""
        return np.frombuffer(data, self.dtype).reshape(self.shape).copy()

    def upload(self, array: Any) -> None:
        """Queue a host-to-device copy of `array` (same dtype and shape) into this tensor."""
        self._client.upload(self, array)

    def free(self) -> None:
        """Queue the free; the daemon releases the memory once work using it has completed."""
        if not self.freed:
            self.freed = True
            self._client._queue([Opcode.FREE, self._client._next_seq(), self.handle])

    def __repr__(self) -> str:
        return f"<gpud Tensor #{self.handle} {self.dtype}{list(self.shape)}{' freed' if self.freed else ''}>"


class Client:
    def __init__(self, sock: zmq.Socket[bytes], address: str, spin_us: float = 0.0) -> None:
        self.address = address
        self._sock = sock
        self._incoming = SocketReader(sock)
        self._spin_s = spin_us / 1e6
        self._received_at = 0.0
        self._unreported: GpudError | None = None  # a daemon error that arrived while nothing waited
        self.last_trace: Trace | None = None  # set when the daemon runs with --trace
        self._seqs = itertools.count(1)
        self._handles = itertools.count(1)
        self._packed = bytearray()  # queued ops, each packed when queued
        self._queued = 0
        self._last_seq = 0  # of the op queued last
        self._pack = msgpack.Packer(use_bin_type=True).pack
        self._dispatch_bodies: dict[tuple[Any, ...], bytes] = {}
        self._frames: list[Any] = []
        self._futures: dict[int, asyncio.Future[tuple[dict[str, Any], list[Any]]]] = {}
        self._unsent: deque[list[Any]] = deque()
        self._send_lock = anyio.Lock()
        self._ack: int | None = None
        self._lost: GpudError | None = None
        self._last_heard = time.monotonic()
        self.welcome: dict[str, Any] = {}
        self.limits = proto.DEFAULT_LIMITS

    # ------------------------------------------------------------------ info

    @property
    def backend(self) -> str:
        return str(self.welcome.get("backend", ""))

    @property
    def session_id(self) -> str:
        return str(self.welcome.get("session", ""))

    # ------------------------------------------------------------------ tensors

    def tensor(self, array: Any, dtype: Any = None) -> Tensor:
        """Allocate a tensor holding a copy of `array` (the copy is taken now)."""
        host = np.asarray(array, dtype=dtype, order="C")  # not ascontiguousarray: it makes 0-d arrays 1-d
        tensor = self.empty(host.shape, host.dtype)
        self.upload(tensor, host)
        return tensor

    def empty(self, shape: int | Sequence[int], dtype: Any = "float32") -> Tensor:
        dims = (shape,) if isinstance(shape, int) else tuple(int(d) for d in shape)
        np_dtype = np.dtype(dtype)
        if np_dtype.name not in proto.DTYPE_SIZES:
            raise InvalidArgument(f"dtype {np_dtype} is not supported: use one of {sorted(proto.DTYPE_SIZES)}")
        handle = next(self._handles)
        self._queue([Opcode.ALLOC, self._next_seq(), handle, np_dtype.name, list(dims)])
        return Tensor(self, handle, np_dtype, dims)

    def upload(self, tensor: Tensor, array: Any) -> None:
        host = np.asarray(array, order="C")
        if host.dtype != tensor.dtype or host.shape != tensor.shape:
            raise InvalidArgument(f"array {host.dtype}{list(host.shape)} does not match {tensor!r}")
        payload = host.tobytes()  # a snapshot: the caller may change `array` before the batch goes
        self._frames.append(payload)
        self._queue([Opcode.UPLOAD, self._next_seq(), self._arg(tensor)[1], len(self._frames) - 1, len(payload)])

    def copy(self, src: Tensor, dst: Tensor) -> None:
        self._queue([Opcode.COPY, self._next_seq(), self._arg(src)[1], self._arg(dst)[1]])

    # ------------------------------------------------------------------ kernels

    async def kernel(
        self,
        source: str,
        entry: str = "main",
        *,
        block: Sequence[int] | None = None,
        flags: Sequence[str] = (),
        writes: Sequence[int] | None = None,
    ) -> Kernel:
        """Compile `source` (WGSL on webgpu, CUDA C on cuda); raises CompileError with the log.

        `block` is CUDA's block size (WGSL sets @workgroup_size in the source). `writes` lists the
        tensor-argument positions the kernel writes, when the daemon cannot infer them.
        """
        options: dict[str, Any] = {}
        if block is not None:
            options["block"] = list(_dim3(block))
        if flags:
            options["flags"] = list(flags)
        if writes is not None:
            options["writes"] = list(writes)
        handle = next(self._handles)
        header, _ = await self._request(Opcode.KERNEL, handle, source, entry, options)
        written = header.get("writes")
        return Kernel(handle, entry, None if written is None else tuple(written))

    def dispatch(
        self,
        kernel: Kernel,
        grid: int | Sequence[int],
        args: Sequence[Any] = (),
        *,
        writes: Sequence[int] | None = None,
    ) -> None:
        """Queue a dispatch: no round trip. Floats go as f32, ints as i32; use u32() for unsigned."""
        # The hot path. Arguments become tuples of plain numbers, common types first; the packed
        # bytes of everything but the sequence number are kept per distinct dispatch (steps
        # repeat), so queueing one costs a lookup and packing one integer.
        encoded = []
        for arg in args:
            kind = type(arg)
            if kind is Tensor and arg._client is self and not arg.freed:
                encoded.append(arg._wire)
            elif kind is float:
                encoded.append((_F32, arg))
            elif kind is Scalar:
                encoded.append((arg[0], arg[1]))
            else:
                encoded.append(self._arg(arg))
        dims = (grid, 1, 1) if type(grid) is int else _dim3(grid)
        key = (kernel.handle, dims, tuple(encoded), None if writes is None else tuple(writes))
        body = self._dispatch_bodies.get(key)
        if body is None:
            if len(self._dispatch_bodies) >= DISPATCH_BODY_CACHE:
                self._dispatch_bodies.clear()
            body = self._dispatch_bodies[key] = b"".join([self._pack(field) for field in key])
        seq = next(self._seqs)
        self._queue_packed(_DISPATCH_PREFIX + self._pack(seq) + body, seq)

    # ------------------------------------------------------------------ requests

    async def sync(self) -> None:
        """Wait until the device has finished all work this session queued."""
        await self._request(Opcode.SYNC)

    async def flush(self) -> None:
        """Send queued ops and return once the daemon accepted them (no wait for the GPU)."""
        await self._request(Opcode.FLUSH)

    async def stats(self) -> dict[str, Any]:
        header, _ = await self._request(Opcode.STATS)
        stats: dict[str, Any] = header["stats"]
        return stats

    # ------------------------------------------------------------------ resident tensors

    def publish(self, tensor: Tensor, name: str, mode: str = "ro") -> None:
        """Publish `tensor` under `name`; other sessions open it read-only ("ro") or read-write."""
        self._queue([Opcode.PUBLISH, self._next_seq(), self._arg(tensor)[1], name, mode])

    async def open(self, name: str) -> Tensor:
        handle = next(self._handles)
        header, _ = await self._request(Opcode.OPEN, handle, name)
        return Tensor(self, handle, np.dtype(header["dtype"]), tuple(header["shape"]), header["mode"])

    def unpublish(self, name: str) -> None:
        self._queue([Opcode.UNPUBLISH, self._next_seq(), name])

    # ------------------------------------------------------------------ plumbing

    def _next_seq(self) -> int:
        return next(self._seqs)

    def _arg(self, value: Any) -> tuple[int, int | float]:
        if isinstance(value, Tensor):
            if value._client is not self or value.freed:
                raise InvalidArgument(f"{value!r} is freed or belongs to another connection")
            return (_TENSOR, value.handle)
        if isinstance(value, Scalar):
            return (value.kind, value.value)
        if isinstance(value, bool):
            raise InvalidArgument("bool is not a kernel argument; pass i32(int(flag))")
        if isinstance(value, float | np.floating):
            return (_F32, float(value))
        if isinstance(value, np.unsignedinteger):
            return (_U32, int(value))
        if isinstance(value, int | np.integer):
            return (_I32, int(value))
        raise InvalidArgument(f"cannot pass {type(value).__name__} to a kernel")

    def _queue(self, op: Sequence[Any]) -> None:
        self._queue_packed(self._pack(op), op[1])

    def _queue_packed(self, packed: bytes, seq: int) -> None:
        """Queue one op, packed as it is queued: no Python object per queued op survives into the
        old generation of a process with a large heap (torch, cupy...)."""
        if self._lost is not None:
            raise self._lost
        self._packed += packed
        self._queued += 1
        self._last_seq = seq
        limits = self.limits
        if (
            self._queued >= limits.max_ops_per_batch
            or len(self._frames) >= limits.max_frames
            or len(self._packed) >= limits.max_header_bytes // 2
        ):
            self._send_batch()

    def _send_batch(self) -> None:
        if not self._queued:
            return
        header = proto.encode_packed_batch(self._packed, self._queued, len(self._frames), self._ack)
        frames, self._frames = self._frames, []
        self._packed, self._queued, self._ack = bytearray(), 0, None
        self._send([header, *frames])

    def _send(self, frames: list[Any]) -> None:
        """Send now if the socket takes it; else keep it, in order, for the next await."""
        if not self._unsent:
            try:
                self._sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
                self._incoming.poke()
                return
            except zmq.Again:  # the daemon is not keeping up: back-pressure
                pass
        self._unsent.append(frames)

    async def _send_unsent(self) -> None:
        async with self._send_lock:
            while self._unsent:
                try:
                    self._sock.send_multipart(self._unsent[0], flags=zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    await anyio.sleep(0.001)  # rare: wait for the daemon to catch up
                    continue
                self._incoming.poke()
                self._unsent.popleft()

    async def _request(self, opcode: Opcode, *fields: Any) -> tuple[dict[str, Any], list[Any]]:
        if (unreported := self._unreported) is not None:
            self._unreported = None
            raise unreported
        seq = self._next_seq()
        self._queue([opcode, seq, *fields])
        future: asyncio.Future[tuple[dict[str, Any], list[Any]]] = asyncio.get_running_loop().create_future()
        self._futures[seq] = future
        sent_at = time.perf_counter()
        self._send_batch()
        try:
            if self._unsent:
                await self._send_unsent()
            if self._spin_s:
                self._spin_until(future)
            header, frames = await future
        finally:
            self._futures.pop(seq, None)  # a cancelled await leaves no entry behind
        if "tr" in header:
            received, executed, flushed, completed = header["tr"]
            self.last_trace = Trace(
                sent_at, received, executed, flushed, completed, self._received_at, time.perf_counter()
            )
        return header, frames

    def _spin_until(self, future: asyncio.Future[Any]) -> None:
        """Poll the socket for up to `spin_us` before yielding to the loop (lower latency, more CPU)."""
        deadline = time.perf_counter() + self._spin_s
        while not future.done() and time.perf_counter() < deadline:
            if (frames := self._incoming.try_recv()) is not None:
                self._on_message(frames)

    async def _reader(self) -> None:
        while True:
            self._on_message(await self._incoming.recv())

    def _on_message(self, frames: list[Any]) -> None:
        self._last_heard = time.monotonic()
        self._received_at = time.perf_counter()
        try:
            header, payload = proto.decode_server_message(frames, self.limits)
        except proto.ProtocolViolation as exc:
            self._fail_all(ProtocolError(f"undecodable message from the daemon: {exc.message}"))
            return
        kind = header["t"]
        if kind == "reply":
            self._resolve(header, payload)
        elif kind == "welcome":
            self._resolve_welcome(header)
        elif kind == "error":
            self._fail_all(from_code(header.get("code", 0), str(header.get("msg", ""))))

    def _resolve(self, header: dict[str, Any], payload: list[Any]) -> None:
        future = self._futures.pop(header.get("seq", -1), None)
        if header.get("ok"):
            if future is not None and not future.done():
                future.set_result((header, payload))
            return
        code, message, failed_seq, op = header["err"]
        self._ack = failed_seq if self._ack is None else max(self._ack, failed_seq)
        if future is not None and not future.done():
            future.set_exception(from_code(code, message, seq=failed_seq, op=op))

    def _resolve_welcome(self, header: dict[str, Any]) -> None:
        self.welcome = header
        known = {k: v for k, v in header.get("limits", {}).items() if k in proto.Limits.__dataclass_fields__}
        self.limits = proto.Limits(**known)
        if (future := self._futures.pop(0, None)) is not None and not future.done():
            future.set_result((header, []))

    def _fail_all(self, error: GpudError) -> None:
        futures, self._futures = self._futures, {}
        pending = [future for future in futures.values() if not future.done()]
        for future in pending:
            future.set_exception(error)
        if not pending and not isinstance(error, DaemonLost):
            self._unreported = error  # nobody waits: the next request raises it, so it is not lost

    def _mark_lost(self, error: DaemonLost) -> None:
        if self._lost is None:
            self._lost = error
        self._fail_all(error)

    async def _heartbeat(self) -> None:
        lease = float(self.welcome.get("lease_s", 5.0))
        patience = 3 * lease  # a busy daemon answers late; a dead one is usually seen at once
        while True:
            await anyio.sleep(lease / 4)
            if time.monotonic() - self._last_heard > patience:
                self._mark_lost(DaemonLost(f"the daemon at {self.address} did not answer for {patience:.1f} s"))
                return
            self._send([proto.PING])

    async def _watch_disconnect(self, monitor: zmq.Socket[bytes]) -> None:
        events = SocketReader(monitor)
        try:
            while True:
                event = parse_monitor_message([frame.bytes for frame in await events.recv()])
                if event["event"] == zmq.EVENT_DISCONNECTED:
                    self._mark_lost(DaemonLost(f"the daemon at {self.address} went away"))
                    return
        finally:
            events.close()

    async def _handshake(self, timeout: float) -> None:
        future: asyncio.Future[tuple[dict[str, Any], list[Any]]] = asyncio.get_running_loop().create_future()
        self._futures[0] = future
        self._send([proto.encode_hello(Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python", os.getpid())])
        try:
            with anyio.fail_after(timeout):
                await future
        except TimeoutError:
            raise DaemonLost(f"no gpud answered at {self.address} within {timeout:.0f} s") from None

    async def close(self) -> None:
        """Send what is queued and say bye; the daemon frees this session's private resources."""
        if self._lost is None:
            self._send_batch()
            self._send([proto.BYE])
            with anyio.move_on_after(5):
                await self._send_unsent()
        self._mark_lost(DaemonLost("the connection is closed"))


def _dim3(value: int | Sequence[int]) -> tuple[int, ...]:
    dims = (value,) if isinstance(value, int) else tuple(int(v) for v in value)
    if not 1 <= len(dims) <= 3:
        raise InvalidArgument(f"grid/block needs 1 to 3 dimensions, got {value!r}")
    return dims + (1,) * (3 - len(dims))


@contextlib.asynccontextmanager
async def connect(
    address: str | None = None,
    *,
    timeout: float = HANDSHAKE_TIMEOUT_S,
    server_public_key: bytes | None = None,
    spin_us: float = 0.0,
) -> AsyncIterator[Client]:
    """Open a session with the daemon at `address` (default: GPUD_ADDRESS or the system socket).

    `spin_us`: after sending a request, poll the socket this long before yielding to the event
    loop. It lowers round-trip latency at the cost of CPU and of blocking the loop meanwhile.

    For tcp:// with CURVE, pass the daemon's public key (z85); the client makes a key pair of its own.
    """
    address = address or default_address()
    if address.startswith("ipc://") and not Path(address[len("ipc://") :]).exists():
        raise DaemonLost(f"no gpud socket at {address}: start one with `gpud serve`")
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.SNDHWM, SEND_QUEUE_MESSAGES)
    sock.setsockopt(zmq.RCVHWM, 0)  # replies are bounded by the daemon's per-session request window
    sock.setsockopt(zmq.LINGER, 0)
    if server_public_key is not None:
        public, secret = zmq.curve_keypair()
        sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = server_public_key, public, secret
    monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    sock.connect(address)
    client = Client(sock, address, spin_us)
    error: BaseException | None = None
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(client._reader)
            tg.start_soon(client._watch_disconnect, monitor)
            await client._handshake(timeout)
            tg.start_soon(client._heartbeat)
            try:
                yield client
            finally:
                await client.close()
                tg.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        # The task group wraps whatever leaves it; callers catch the error itself (DaemonLost from
        # the handshake, a GpudError or their own exception from the body), not a group of one.
        if len(group.exceptions) != 1:
            raise
        error = group.exceptions[0]
    finally:
        client._incoming.close()
        sock.disable_monitor()
        monitor.close(linger=0)
        sock.close(linger=0)
        ctx.term()
    if error is not None:
        raise error


__all__ = ["Client", "GpudError", "Kernel", "Scalar", "Tensor", "connect", "default_address", "f32", "i32", "u32"]

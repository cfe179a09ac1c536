"""The connection to the daemon: one socket, one reader task resolving futures by sequence number,
heartbeats, and the detection of a daemon that went away.

A cancelled await never loses another reply (futures are resolved by seq, and messages stay in the
socket until the one reader takes them). Every future resolves: with data, or with an error
(DaemonLost when the daemon stops answering or goes away, SessionLost when it ended the session).

Heartbeats come from a thread with a socket of its own, carrying the session's beat key: a client
whose event loop is blocked (tokenizing, loading a model, a breakpoint) keeps its session, while
the session of a process that died still ends one lease after its death.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import statistics
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, NamedTuple

import anyio
import numpy as np
import zmq
from zmq.utils.monitor import parse_monitor_message

import gpud_protocol as proto
from gpud_client.batch import OpQueue
from gpud_client.errors import DaemonLost, GpudError, ProtocolError, SessionLost, from_code
from gpud_protocol.reader import SocketReader

HANDSHAKE_TIMEOUT_S = 10.0
NAMED_OPS = 65536  # op-library calls whose name a failure reported later can still be given
SEND_QUEUE_MESSAGES = 64  # messages queued in ZeroMQ before the client holds batches itself

Reply = tuple[dict[str, Any], Any]  # (header, data: a frame's buffer, an assembled array, or None)


def default_address(system: Path = Path("/run/gpud/gpud.sock")) -> str:
    """`GPUD_ADDRESS`; else a per-user daemon's socket, $XDG_RUNTIME_DIR/gpud/gpud.sock, if it exists;
    else the system daemon's socket `system` (the systemd unit's; group gpud may connect) if it
    exists; else the per-user path (root: the system one), where `connect()` then says nothing listens."""
    if address := os.environ.get("GPUD_ADDRESS"):
        return address
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if not runtime or os.geteuid() == 0:
        return f"ipc://{system}"
    user = Path(runtime) / "gpud" / "gpud.sock"
    return f"ipc://{system if not user.exists() and system.exists() else user}"


class Trace(NamedTuple):
    """perf_counter stamps of one readback (same clock in every process of a host)."""

    sent: float  # client: batch handed to ZeroMQ
    received: float  # daemon: message read from the socket
    executed: float  # daemon: the readback's copy encoded
    flushed: float  # daemon: the command buffer submitted
    completed: float  # daemon: the copy completed, reply about to be sent
    replied: float  # client: reply read from the socket
    resumed: float  # client: the awaiting task resumed

    @staticmethod
    def median_stages_us(traces: list[Trace]) -> dict[str, float]:
        """Where round trips go: each stage's median over `traces`, in microseconds."""
        stages = {
            "client_to_daemon": [t.received - t.sent for t in traces],
            "daemon_decode_execute": [t.executed - t.received for t in traces],
            "until_flush": [t.flushed - t.executed for t in traces],
            "gpu_and_completion": [t.completed - t.flushed for t in traces],
            "daemon_to_client": [t.replied - t.completed for t in traces],
            "client_resume": [t.resumed - t.replied for t in traces],
        }
        return {name: 1e6 * statistics.median(values) for name, values in stages.items() if values}


class _Parts:
    """A readback arriving in several messages, copied into one array as the parts come."""

    __slots__ = ("data", "header", "left", "offset")

    def __init__(self, header: dict[str, Any]) -> None:
        self.header = header
        self.data = np.empty(int(header["n"]), np.uint8)
        self.offset = 0
        self.left = int(header["parts"])

    def add(self, frame: Any) -> bool:
        view = np.frombuffer(frame.buffer if hasattr(frame, "buffer") else frame, np.uint8)
        self.data[self.offset : self.offset + view.size] = view
        self.offset += view.size
        self.left -= 1
        return self.left == 0


class Connection:
    def __init__(self, sock: zmq.Socket[bytes], address: str, spin_us: float = 0.0) -> None:
        self.address = address
        self._sock = sock
        self._incoming = SocketReader(sock)
        self._spin_s = spin_us / 1e6
        self.queue = OpQueue(proto.DEFAULT_LIMITS)
        self._futures: dict[int, asyncio.Future[Reply]] = {}
        self._parts: dict[int, _Parts] = {}
        self._send_lock = anyio.Lock()
        self._window_moved = anyio.Event()
        self._unreported: GpudError | None = None  # a daemon error that arrived while nothing waited
        self.lost: GpudError | None = None
        self._last_heard = time.monotonic()
        self._received_at = 0.0
        self.welcome: dict[str, Any] = {}
        self.limits = proto.DEFAULT_LIMITS
        self.last_trace: Trace | None = None
        self._beats: _BeatThread | None = None
        self.server_public_key: bytes | None = None
        self._op_names: OrderedDict[int, str] = OrderedDict()  # seq of an op-library dispatch -> its op

    # ------------------------------------------------------------------ sending

    def send_batch(self) -> None:
        """Make a batch of what is queued and send it (or hold it while the window is full)."""
        frames = self.queue.take()
        if frames is not None:
            self._send(frames)

    def _send(self, frames: list[Any]) -> None:
        queue = self.queue
        if not queue.held and queue.window_open:
            try:
                self._sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
                self._incoming.poke()
                return
            except zmq.Again:  # the daemon is not keeping up: back-pressure
                pass
        queue.held.append(frames)

    async def send_held(self) -> None:
        """Send the batches held back, waiting for the daemon to confirm earlier ones when needed."""
        queue = self.queue
        async with self._send_lock:
            while queue.held:
                if self.lost is not None:
                    raise self.lost
                if not queue.window_open:
                    self._window_moved = anyio.Event()
                    with anyio.move_on_after(0.05):
                        await self._window_moved.wait()
                    continue
                try:
                    self._sock.send_multipart(queue.held[0], flags=zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    await anyio.sleep(0.001)  # rare: wait for the daemon to catch up
                    continue
                self._incoming.poke()
                queue.held.popleft()

    def _send_control(self, message: bytes) -> None:
        with contextlib.suppress(zmq.ZMQError):
            self._sock.send(message, flags=zmq.NOBLOCK)
            self._incoming.poke()

    async def request(self, seq: int) -> Reply:
        """Send what is queued (the request `seq` is its last op) and wait for the reply."""
        if (unreported := self._unreported) is not None:
            self._unreported = None
            raise unreported
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._futures[seq] = future
        sent_at = time.perf_counter()
        self.send_batch()
        try:
            if self.queue.held:
                await self.send_held()
            if self._spin_s:
                self._spin_until(future)
            header, data = await future
        finally:
            self._futures.pop(seq, None)  # a cancelled await leaves no entry behind
        if "tr" in header:
            received, executed, flushed, completed = header["tr"]
            self.last_trace = Trace(
                sent_at, received, executed, flushed, completed, self._received_at, time.perf_counter()
            )
        return header, data

    def expect(self, seq: int) -> None:
        """A request nobody awaits (a kernel the op library registers on first use): its error, if
        any, is raised by the next request, so it is not lost."""
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._futures[seq] = future

        def done(f: asyncio.Future[Reply]) -> None:
            self._futures.pop(seq, None)
            error = None if f.cancelled() else f.exception()
            lost = isinstance(error, DaemonLost | SessionLost)
            if isinstance(error, GpudError) and not lost and self._unreported is None:
                self._unreported = error

        future.add_done_callback(done)

    def name_op(self, seq: int, op: str) -> None:
        """The dispatch `seq` is the op-library call `op`: its failure says "add", not "dispatch"."""
        names = self._op_names
        names[seq] = op
        if len(names) > NAMED_OPS:
            names.popitem(last=False)

    def _spin_until(self, future: asyncio.Future[Any]) -> None:
        """Poll the socket for up to `spin_us` before yielding to the loop (lower latency, more CPU)."""
        deadline = time.perf_counter() + self._spin_s
        while not future.done() and time.perf_counter() < deadline:
            if (frames := self._incoming.try_recv()) is not None:
                self._on_message(frames)

    # ------------------------------------------------------------------ receiving

    async def reader(self) -> None:
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
        elif kind == "part":
            self._part(header, payload)
        elif kind == "receipt":
            self.queue.receipt(int(header.get("b", 0)))
            self._window_moved.set()
        elif kind == "welcome":
            self._resolve_welcome(header)
        elif kind == "error":
            error = from_code(header.get("code", 0), str(header.get("msg", "")))
            if isinstance(error, SessionLost):
                self.mark_lost(error)
            else:
                self._fail_all(error)

    def _resolve(self, header: dict[str, Any], payload: list[Any]) -> None:
        seq = header.get("seq", -1)
        self.queue.replied(seq)
        self._window_moved.set()
        future = self._futures.get(seq)
        if header.get("ok"):
            names = self._op_names
            while names and next(iter(names)) < seq:  # answered: nothing before it failed unreported
                names.popitem(last=False)
            parts = int(header.get("parts", 1))
            if parts > 1:
                assembly = self._parts[seq] = _Parts(header)
                assembly.add(payload[0])
                return
            if future is not None and not future.done():
                future.set_result((header, payload[0].buffer if payload else None))
            return
        code, message, failed_seq, op = header["err"]
        if op == "dispatch":
            op = self._op_names.get(failed_seq, op)
        self.queue.acks.add(failed_seq)
        self._parts.pop(seq, None)
        if future is not None and not future.done():
            future.set_exception(from_code(code, message, seq=failed_seq, op=op))

    def _part(self, header: dict[str, Any], payload: list[Any]) -> None:
        seq = header.get("seq", -1)
        assembly = self._parts.get(seq)
        if assembly is None or not payload:
            return
        if assembly.add(payload[0]):
            del self._parts[seq]
            future = self._futures.get(seq)
            if future is not None and not future.done():
                future.set_result((assembly.header, assembly.data))

    def _resolve_welcome(self, header: dict[str, Any]) -> None:
        self.welcome = header
        known = {k: v for k, v in header.get("limits", {}).items() if k in proto.Limits.__dataclass_fields__}
        self.limits = proto.Limits(**known)
        self.queue.limits = self.limits
        self.queue.window = int(header.get("window", self.queue.window))
        if (future := self._futures.get(0)) is not None and not future.done():
            future.set_result((header, None))

    def _fail_all(self, error: GpudError) -> None:
        futures, self._futures = self._futures, {}
        self._parts.clear()
        pending = [future for future in futures.values() if not future.done()]
        for future in pending:
            future.set_exception(error)
        if not pending and not isinstance(error, DaemonLost | SessionLost):
            self._unreported = error  # nobody waits: the next request raises it, so it is not lost

    def mark_lost(self, error: GpudError) -> None:
        if self.lost is None:
            self.lost = error
        self._window_moved.set()
        self._fail_all(error)

    # ------------------------------------------------------------------ liveness

    async def heartbeat(self) -> None:
        """Ping the daemon; it is lost if a ping stays unanswered for three leases. Only pings this
        loop really sent count: after the loop was blocked, the answers wait in the socket."""
        lease = float(self.welcome.get("lease_s", 5.0))
        patience = 3 * lease  # a busy daemon answers late; a dead one is usually seen at once
        unanswered_since: float | None = None
        while True:
            await anyio.sleep(lease / 4)
            while (frames := self._incoming.try_recv()) is not None:
                self._on_message(frames)
            now = time.monotonic()
            if unanswered_since is not None and self._last_heard >= unanswered_since:
                unanswered_since = None
            if unanswered_since is not None and now - unanswered_since > patience:
                self.mark_lost(DaemonLost(f"the daemon at {self.address} did not answer for {patience:.1f} s"))
                return
            if self._beats is not None and self._beats.session_lost:
                self.mark_lost(SessionLost("the daemon ended this session (see its log); connect again"))
                return
            self._send_control(proto.PING)
            if unanswered_since is None:
                unanswered_since = now

    def start_beats(self, context: zmq.Context[Any]) -> None:
        session, key = str(self.welcome.get("session", "")), str(self.welcome.get("key", ""))
        interval = float(self.welcome.get("lease_s", 5.0)) / 4
        beat = proto.encode_beat(session, key)
        self._beats = _BeatThread(context, self.address, beat, interval, self.server_public_key)
        self._beats.start()

    async def watch_disconnect(self, monitor: zmq.Socket[bytes]) -> None:
        events = SocketReader(monitor)
        try:
            while True:
                event = parse_monitor_message([frame.bytes for frame in await events.recv()])
                if event["event"] == zmq.EVENT_DISCONNECTED:
                    self.mark_lost(DaemonLost(f"the daemon at {self.address} went away"))
                    return
        finally:
            events.close()

    async def handshake(self, timeout: float, device: int | None) -> None:
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._futures[0] = future
        name = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python"
        self._send_control(proto.encode_hello(name, os.getpid(), device))
        try:
            with anyio.fail_after(timeout):
                await future
        except TimeoutError:
            raise DaemonLost(f"no gpud answered at {self.address} within {timeout:.0f} s") from None
        finally:
            self._futures.pop(0, None)

    async def close(self) -> None:
        """Send what is queued and say bye; the daemon frees this session's private resources."""
        if self._beats is not None:
            self._beats.stop()
        if self.lost is None:
            self.send_batch()
            with anyio.move_on_after(5):
                await self.send_held()
            self._send_control(proto.BYE)
        self.mark_lost(DaemonLost("the connection is closed"))

    def close_socket(self) -> None:
        self._incoming.close()


class _BeatThread(threading.Thread):
    """Sends the session's beat from its own socket every `interval` seconds, whatever the event loop does."""

    def __init__(
        self, context: zmq.Context[Any], address: str, beat: bytes, interval: float, server_key: bytes | None
    ) -> None:
        super().__init__(name="gpud-client-beats", daemon=True)
        self._context = context
        self._address = address
        self._beat = beat
        self._interval = interval
        self._server_key = server_key
        self._stopping = threading.Event()
        self.session_lost = False

    def run(self) -> None:
        sock = self._context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 4)
        if self._server_key is not None:
            public, secret = zmq.curve_keypair()
            sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = self._server_key, public, secret
        try:
            sock.connect(self._address)
            while not self._stopping.is_set():
                with contextlib.suppress(zmq.ZMQError):
                    sock.send(self._beat, flags=zmq.NOBLOCK)
                while True:  # the daemon answers a beat only when the session is gone
                    try:
                        sock.recv_multipart(flags=zmq.NOBLOCK)
                    except zmq.ZMQError:
                        break
                    self.session_lost = True
                self._stopping.wait(self._interval)
        finally:
            sock.close(linger=0)

    def stop(self) -> None:
        self._stopping.set()
        if self.is_alive():
            self.join(timeout=2)


def check_listening(address: str) -> None:
    """Fail fast (DaemonLost) when nothing listens at `address`, instead of waiting for a handshake."""
    if address.startswith("ipc://"):
        path = address[len("ipc://") :]
        if not Path(path).exists():
            raise DaemonLost(f"no gpud socket at {address}: start one with `gpud serve`")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
        except ConnectionRefusedError:
            raise DaemonLost(f"nothing listens at {address} (a stale socket file): start `gpud serve`") from None
        except PermissionError:
            raise DaemonLost(f"no permission to use {address}: join the socket's group (gpud)") from None
        except OSError:
            pass  # let ZeroMQ say what it thinks
        finally:
            probe.close()
    elif address.startswith("tcp://"):
        host, _, port = address[len("tcp://") :].rpartition(":")
        if port.isdigit():
            try:
                socket.create_connection((host.strip("[]"), int(port)), timeout=2).close()
            except ConnectionRefusedError:
                raise DaemonLost(f"nothing listens at {address}: start `gpud serve`") from None
            except OSError:
                pass


@contextlib.asynccontextmanager
async def open_connection(
    address: str,
    *,
    timeout: float = HANDSHAKE_TIMEOUT_S,
    server_public_key: bytes | None = None,
    spin_us: float = 0.0,
    device: int | None = None,
) -> AsyncIterator[Connection]:
    check_listening(address)
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.SNDHWM, SEND_QUEUE_MESSAGES)
    sock.setsockopt(zmq.RCVHWM, 0)  # replies are bounded by the daemon's request window and reply bytes
    sock.setsockopt(zmq.LINGER, 0)
    if server_public_key is not None:
        public, secret = zmq.curve_keypair()
        sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = server_public_key, public, secret
    monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    sock.connect(address)
    connection = Connection(sock, address, spin_us)
    connection.server_public_key = server_public_key
    error: BaseException | None = None
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(connection.reader)
            tg.start_soon(connection.watch_disconnect, monitor)
            await connection.handshake(timeout, device)
            connection.start_beats(ctx)
            tg.start_soon(connection.heartbeat)
            try:
                yield connection
            finally:
                await connection.close()
                tg.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        # The task group wraps whatever leaves it; callers catch the error itself (DaemonLost from
        # the handshake, a GpudError or their own exception from the body), not a group of one.
        if len(group.exceptions) != 1:
            raise
        error = group.exceptions[0]
    finally:
        connection.close_socket()
        if connection._beats is not None:
            connection._beats.stop()
        sock.disable_monitor()
        monitor.close(linger=0)
        sock.close(linger=0)
        ctx.term()
    if error is not None:
        raise error

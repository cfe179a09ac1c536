"""The daemon: a ZeroMQ ROUTER socket, the sessions, their leases, and the receive loop.

One reader drains every message that is ready. Pings and beats are answered at once; batches go to
their sessions round-robin (so no client starves), which execute them or park; then every device
runtime decides whether to flush, so work that arrives together lands in one command buffer. The
loop never waits for a GPU: a session that must wait parks on its own, and replies go out through
per-peer outboxes that never block.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hmac
import logging
import os
import secrets
import signal
import time
from collections import OrderedDict
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import zmq
import zmq.auth

import gpud_protocol as proto
from gpud import __version__
from gpud.backends import open_devices
from gpud.runtime.cache import LruCache
from gpud.runtime.runtime import DeviceRuntime
from gpud.service.config import Config
from gpud.service.lifecycle import ipc_endpoint
from gpud.service.peers import Outboxes
from gpud.session.graphs import GraphStore
from gpud.session.residents import ResidentStore
from gpud.session.session import Session
from gpud.session.tensors import Tensor
from gpud_protocol import ErrorCode, ProtocolViolation
from gpud_protocol.errors import DeviceLost
from gpud_protocol.reader import SocketReader

log = logging.getLogger(__name__)

MAX_DRAIN = 256  # messages taken per drain before the devices get a say
PEER_SEND_QUEUE = 64  # messages ZeroMQ queues per peer; more wait in the peer's outbox
EXIT_DEVICE_LOST = 3


class Server:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.sessions: dict[bytes, Session] = {}
        self._by_id: dict[str, Session] = {}
        self._ended: LruCache[bytes, str] = LruCache(4096)  # identity -> why its session ended
        self.runtimes: list[DeviceRuntime] = []
        self.residents = ResidentStore(self._release, self._is_connected)
        self.graph_store = GraphStore(self._is_connected)
        self._ctx = zmq.Context()
        self._sock: zmq.Socket[bytes] | None = None
        self._reader: SocketReader | None = None
        self._outboxes: Outboxes | None = None
        self._tasks: anyio.abc.TaskGroup | None = None
        self._fatal: BaseException | None = None
        self._stop = anyio.Event()
        self._drained_at = time.monotonic()
        self._waiting = False  # the receive loop is waiting on an empty socket

    async def serve(self, ready: anyio.Event | None = None) -> int:
        """Run until SIGTERM/SIGINT, `stop()`, or a fatal device error; return the exit code."""
        config = self.config
        with self._listening():
            loop = asyncio.get_running_loop()
            devices = open_devices(config.backend, config.devices, loop, config)
            self.runtimes = [
                DeviceRuntime(device, config, self._device_lost, config.limits.reply_part_bytes) for device in devices
            ]
            self.residents = ResidentStore(
                self._release, self._is_connected, config.resident_max_count, config.resident_max_bytes
            )
            # Long-lived startup objects need no more scanning, and the hot path allocates many
            # short-lived tuples: a larger first generation cuts collection pauses by about a quarter.
            gc.freeze()
            gc.set_threshold(50_000, 20, 100)
            for rt in self.runtimes:
                log.info("device %d: %s", rt.index, _describe(rt.info()))
                if rt.device.software:
                    log.warning(
                        "device %d is a software rasteriser (lavapipe): slow, and Mesa cuts every shader loop "
                        "at 65,535 iterations, silently",
                        rt.index,
                    )
            log.info("gpud %s serving %s with %d device(s)", __version__, config.address, len(self.runtimes))
            try:
                async with anyio.create_task_group() as tg:
                    self._tasks = tg
                    tg.start_soon(self._receive_loop)
                    tg.start_soon(self._lease_loop)
                    tg.start_soon(self._outbox_loop)
                    tg.start_soon(self._signals)
                    if ready is not None:
                        ready.set()
                    await self._stop.wait()
                    tg.cancel_scope.cancel()
            finally:
                await self._shutdown()
        if self._fatal is not None:
            log.error("exiting after a fatal device error: %s", self._fatal)
            return EXIT_DEVICE_LOST
        return 0

    def stop(self) -> None:
        self._stop.set()

    # ------------------------------------------------------------------ what sessions use

    def spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        """Run a parked session's resumption in the server's task group."""
        assert self._tasks is not None

        async def run() -> None:
            try:
                await coroutine
            except Exception:  # a bug in one session must not take the daemon down
                log.exception("a session task failed")

        self._tasks.start_soon(run)

    def after_work(self) -> None:
        for rt in self.runtimes:
            rt.after_drain()

    def _release(self, tensor: Tensor) -> None:
        self.runtimes[tensor.device].release(tensor.buffer)

    def _is_connected(self, session_id: str) -> bool:
        return session_id in self._by_id

    # ------------------------------------------------------------------ socket

    @contextlib.contextmanager
    def _listening(self) -> Iterator[zmq.Socket[bytes]]:
        address, limits = self.config.address, self.config.limits
        sock = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.setsockopt(zmq.SNDHWM, PEER_SEND_QUEUE)
        sock.setsockopt(zmq.RCVHWM, 1024)
        sock.setsockopt(zmq.MAXMSGSIZE, max(limits.max_tensor_bytes, limits.max_header_bytes) + 4096)
        sock.setsockopt(zmq.LINGER, 0)
        with contextlib.ExitStack() as stack:
            if address.startswith("ipc://"):
                stack.enter_context(ipc_endpoint(Path(address[len("ipc://") :])))
            elif address.startswith("tcp://"):
                self._secure_tcp(sock)
            else:
                raise ValueError(f"unsupported address {address!r}: use ipc:// or tcp://")
            sock.bind(address)
            if address.startswith("ipc://"):
                os.chmod(address[len("ipc://") :], 0o660)
            self._sock = sock
            self._reader = SocketReader(sock)
            self._outboxes = Outboxes(
                sock, self._reader.poke, self._peer_stuck, self.config.session_reply_bytes, self.config.lease_s
            )
            try:
                yield sock
            finally:
                self._reader.close()
                sock.close(linger=0)
                self._ctx.term()

    def _secure_tcp(self, sock: zmq.Socket[bytes]) -> None:
        key_file = self.config.curve_secret_key
        if key_file:
            public, secret = zmq.auth.load_certificate(key_file)
            if secret is None:
                raise ValueError(f"{key_file} holds no secret key")
            sock.curve_server = True
            sock.curve_secretkey = secret
            sock.curve_publickey = public
        elif not self.config.insecure_tcp:
            raise ValueError("tcp:// needs CURVE keys (--curve-secret-key); pass --insecure-tcp to allow plain tcp")
        else:
            log.warning("serving plain tcp without authentication: anyone who reaches the port can use the GPU")

    def _send(self, identity: bytes, frames: list[Any]) -> None:
        assert self._outboxes is not None
        self._outboxes.send(identity, frames)

    def _peer_stuck(self, identity: bytes, reason: str) -> None:
        self._end_session(identity, reason)

    # ------------------------------------------------------------------ loops

    async def _receive_loop(self) -> None:
        assert self._reader is not None
        reader = self._reader
        limits = self.config.limits
        while True:
            messages = [await self._next_message(reader)]
            received_at = time.perf_counter()
            while len(messages) < MAX_DRAIN:
                if (frames := reader.try_recv()) is None:
                    self._drained_at = time.monotonic()
                    break
                messages.append(frames)
            now = time.monotonic()
            work: list[tuple[bytes, Any]] = []
            for identity_frame, *frames in messages:
                identity = identity_frame.bytes
                session = self.sessions.get(identity)
                try:
                    memo = session.dispatch_memo if session is not None else None
                    message = proto.decode_client_message([f.buffer for f in frames], limits, memo)
                except ProtocolViolation as exc:
                    log.info("bad message from %s: %s", identity.hex(), exc.message)
                    self._send(identity, [proto.encode_error(exc.code, exc.message)])
                    continue
                except Exception as exc:  # a decoder bug must not take the daemon down for everyone
                    log.exception("internal error decoding a message from %s", identity.hex())
                    self._send(identity, [proto.encode_error(ErrorCode.INTERNAL, f"internal error decoding: {exc}")])
                    continue
                if session is not None:
                    session.last_seen = now
                if type(message) is proto.Ping and session is not None:
                    self._send(identity, [proto.PONG])  # answered before any work of this drain
                elif type(message) is proto.Beat:
                    self._beat(identity, message)
                else:
                    work.append((identity, message))
            for identity, message in _round_robin(work):
                try:
                    self._handle(identity, message, received_at)
                except Exception as exc:  # a bug must not take the daemon down for everyone
                    log.exception("internal error handling a message from %s", identity.hex())
                    self._send(identity, [proto.encode_error(ErrorCode.INTERNAL, f"internal error: {exc}")])
            self.after_work()

    async def _next_message(self, reader: SocketReader) -> list[Any]:
        """Wait for a message; with `busy_poll_us`, poll for it first (lower latency, one busy core)."""
        if self.config.busy_poll_us > 0:
            deadline = time.perf_counter() + self.config.busy_poll_us / 1e6
            while time.perf_counter() < deadline:
                await asyncio.sleep(0)  # replies and completions run in between
                if (frames := reader.try_recv()) is not None:
                    return frames
        self._waiting = True  # the socket is empty for as long as this waits
        try:
            return await reader.recv()
        finally:
            self._waiting = False

    def _handle(self, identity: bytes, message: Any, received_at: float) -> None:
        session = self.sessions.get(identity)
        match message:
            case proto.Batch() if session is not None:
                session.receive(message, received_at)
            case proto.Hello():
                self._hello(identity, message)
            case proto.Bye():
                self._end_session(identity, "said bye")
            case _:
                reason = self._ended.get(identity)
                text = f"session ended: {reason}; connect again" if reason else "no session: send hello first"
                self._send(identity, [proto.encode_error(ErrorCode.SESSION, text)])

    def _hello(self, identity: bytes, hello: proto.Hello) -> None:
        config = self.config
        if hello.version != proto.PROTOCOL_VERSION:
            message = f"protocol version {hello.version} unsupported; this daemon speaks {proto.PROTOCOL_VERSION}"
            self._send(identity, [proto.encode_error(ErrorCode.PROTOCOL, message)])
            return
        self._end_session(identity, "reconnected")  # a reconnect with the same identity starts afresh
        if len(self.sessions) >= config.max_sessions:
            self._send(identity, [proto.encode_error(ErrorCode.BUSY, f"{config.max_sessions} sessions: no room")])
            return
        if hello.device is not None and hello.device >= len(self.runtimes):
            text = f"no device {hello.device}: this daemon has {len(self.runtimes)}"
            self._send(identity, [proto.encode_error(ErrorCode.INVALID_ARGUMENT, text)])
            return
        device = hello.device if hello.device is not None else self._least_loaded()
        session_id = secrets.token_hex(8)

        def send(frames: list[Any]) -> None:
            self._send(identity, frames)

        session = Session(session_id, f"{hello.name}[{hello.pid}]", send, self, config, device)
        session.beat_key = secrets.token_hex(16)
        self.sessions[identity] = session
        self._by_id[session_id] = session
        self.runtimes[device].sessions += 1
        log.info("session %s opened by %s[%s] on device %d", session_id, hello.name, hello.pid, device)
        welcome = {
            "t": "welcome",
            "v": proto.PROTOCOL_VERSION,
            "session": session_id,
            "key": session.beat_key,
            "daemon": __version__,
            "backend": self.runtimes[0].device.kind,
            "devices": [rt.info() for rt in self.runtimes],
            "device": device,
            "limits": config.limits.as_dict(),
            "lease_s": config.lease_s,
            "max_requests": config.session_max_requests,
            "window": config.session_window,
        }
        self._send(identity, [proto.pack(welcome)])

    def _least_loaded(self) -> int:
        return min(self.runtimes, key=lambda rt: (rt.sessions, rt.memory_in_use, rt.index)).index

    def _beat(self, identity: bytes, beat: proto.Beat) -> None:
        session = self._by_id.get(beat.session)
        if session is None or not hmac.compare_digest(session.beat_key.encode(), beat.key.encode()):
            self._send(identity, [proto.encode_error(ErrorCode.SESSION, "no such session")])
            return
        session.last_seen = time.monotonic()

    def _end_session(self, identity: bytes, reason: str) -> None:
        session = self.sessions.pop(identity, None)
        if self._outboxes is not None and reason != "reconnected":
            self._outboxes.drop(identity)
        if session is None:
            return
        self._by_id.pop(session.id, None)
        self.runtimes[session.device].sessions -= 1
        session.close()
        self._ended.put(identity, reason)
        log.info("session %s (%s) ended: %s", session.id, session.client, reason)

    async def _lease_loop(self) -> None:
        lease = self.config.lease_s
        while True:
            await anyio.sleep(lease / 4)
            # Judge by the last time the socket was read empty, not by the clock: while the loop
            # is busy, heartbeats wait unread in the socket and prove nothing.
            drained = time.monotonic() if self._waiting else self._drained_at
            deadline = drained - lease
            for identity, session in list(self.sessions.items()):
                if session.last_seen < deadline:
                    self._end_session(identity, f"its lease expired (no message for {lease:.1f} s)")

    async def _outbox_loop(self) -> None:
        assert self._outboxes is not None
        outboxes = self._outboxes
        while True:
            await anyio.sleep(0.0005 if outboxes else 0.05)
            if outboxes:
                outboxes.retry()

    async def _signals(self) -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for _ in signals:
                log.info("signal received; shutting down")
                self.stop()
                return

    def _device_lost(self, rt: DeviceRuntime, error: DeviceLost) -> None:
        if self._fatal is None:
            self._fatal = error
            log.critical("device %d lost: %s", rt.index, error)
            for identity in list(self.sessions):
                self._send(identity, [proto.encode_error(ErrorCode.DEVICE_LOST, f"device {rt.index} lost: {error}")])
            self.stop()

    async def _shutdown(self) -> None:
        for identity in list(self.sessions):
            self._end_session(identity, "the daemon is stopping")
        for name in self.graph_store.names():
            family = self.graph_store.unpublish(name, by="")
            family.builder = None
            _drop_family(family, self.residents)
        self.residents.clear()
        for rt in self.runtimes:
            await rt.close(self.config.drain_timeout_s)

    def stats(self) -> dict[str, Any]:
        return {"sessions": len(self.sessions), "outboxes": self._outboxes.stats() if self._outboxes else {}}


def _drop_family(family: Any, residents: ResidentStore) -> None:
    """A published graph at shutdown: release what it holds (its sessions are gone)."""
    from gpud.session import graph_ops

    graph_ops.release(family, residents)


def _describe(info: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in info.items() if k not in ("index",))


def _round_robin(messages: list[tuple[bytes, Any]]) -> Iterator[tuple[bytes, Any]]:
    """Interleave messages of different peers, keeping each peer's own order."""
    queues: OrderedDict[bytes, list[Any]] = OrderedDict()
    for identity, message in messages:
        queues.setdefault(identity, []).append(message)
    while queues:
        for identity in list(queues):
            pending = queues[identity]
            yield identity, pending.pop(0)
            if not pending:
                del queues[identity]

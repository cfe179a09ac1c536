"""The daemon: a ZeroMQ ROUTER socket, the session registry, leases and the drain loop.

One reader drains every message that is ready, executes them (interleaving sessions round-robin
so no client starves), and then lets the scheduler flush once: work that arrives together lands
in one command buffer. Replies go out through ROUTER_MANDATORY, so a reply to a vanished peer is
an error we see, not a silent drop.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import gc
import logging
import os
import secrets
import signal
import time
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import zmq
import zmq.auth

import gpud_protocol as proto
from gpud import __version__
from gpud.backends import create_backend
from gpud.backends.base import Backend
from gpud.config import Config
from gpud.resident import ResidentStore
from gpud.scheduler import Scheduler
from gpud.session import Session
from gpud_client.zmqio import SocketReader
from gpud_protocol import ErrorCode, ProtocolViolation
from gpud_protocol.errors import DeviceLost

log = logging.getLogger(__name__)

MAX_DRAIN = 256  # messages taken per drain before the scheduler gets a say
EXIT_DEVICE_LOST = 3


class AddressInUse(RuntimeError):
    pass


class Server:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.sessions: dict[bytes, Session] = {}
        self._ctx = zmq.Context()
        self._sock: zmq.Socket[bytes] | None = None
        self._reader: SocketReader | None = None
        self.backend: Backend | None = None
        self._scheduler: Scheduler | None = None
        self._residents: ResidentStore | None = None
        self._fatal: BaseException | None = None
        self._stop = anyio.Event()
        self._drained_at = time.monotonic()
        self._waiting = False  # the receive loop is waiting on an empty socket

    async def serve(self, ready: anyio.Event | None = None) -> int:
        """Run until SIGTERM/SIGINT, `stop()`, or a fatal device error; return the exit code."""
        with self._listening():
            self.backend = create_backend(self.config, self._on_fatal)
            # Long-lived startup objects need no more scanning, and the hot path allocates many
            # short-lived tuples: a larger first generation cuts collection pauses by about a quarter.
            gc.freeze()
            gc.set_threshold(50_000, 20, 100)
            self._scheduler = Scheduler(self.backend, self.config)
            self._residents = ResidentStore(self.backend, self._is_connected)
            log.info("gpud %s serving %s on %s", __version__, self.config.address, self.backend.device_info())
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._receive_loop)
                    tg.start_soon(self._lease_loop)
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

    # ------------------------------------------------------------------ socket

    @contextlib.contextmanager
    def _listening(self) -> Iterator[zmq.Socket[bytes]]:
        address = self.config.address
        sock = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.setsockopt(zmq.SNDHWM, 0)  # bounded by per-session request windows instead
        sock.setsockopt(zmq.RCVHWM, 1024)
        sock.setsockopt(zmq.LINGER, 0)
        with contextlib.ExitStack() as stack:
            if address.startswith("ipc://"):
                stack.enter_context(_ipc_endpoint(Path(address[len("ipc://") :])))
            elif address.startswith("tcp://"):
                self._secure_tcp(sock)
            else:
                raise ValueError(f"unsupported address {address!r}: use ipc:// or tcp://")
            sock.bind(address)
            if address.startswith("ipc://"):
                os.chmod(address[len("ipc://") :], 0o660)
            self._sock = sock
            self._reader = SocketReader(sock)
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
        assert self._sock is not None and self._reader is not None
        try:  # SNDHWM is 0, so this never blocks: the per-session request window bounds the queue
            self._sock.send_multipart([identity, *frames], flags=zmq.NOBLOCK, copy=False)
            self._reader.poke()
        except zmq.ZMQError as exc:  # EHOSTUNREACH: the peer is gone
            log.info("peer %s unreachable (%s); ending its session", identity.hex(), exc)
            self._end_session(identity)

    # ------------------------------------------------------------------ loops

    async def _receive_loop(self) -> None:
        assert self._reader is not None and self._scheduler is not None
        reader = self._reader
        while True:
            messages = [await self._next_message(reader)]
            received_at = time.perf_counter()
            while len(messages) < MAX_DRAIN:
                if (frames := reader.try_recv()) is None:
                    self._drained_at = time.monotonic()
                    break
                messages.append(frames)
            for identity, frames in _round_robin(messages):
                await self._handle(identity, frames, received_at)
            try:
                self._scheduler.after_messages()
            except DeviceLost:
                return  # _on_fatal stops the daemon
            # Stop reading while the device is behind: messages then wait in ZeroMQ (bounded by
            # RCVHWM) and senders block, instead of work piling up in this process.
            await self._scheduler.backend.throttle(self.config.max_submissions_in_flight)

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

    async def _handle(self, identity: bytes, frames: list[Any], received_at: float = 0.0) -> None:
        session = self.sessions.get(identity)
        memo = session.dispatch_memo if session is not None else None
        try:
            message = proto.decode_client_message([f.buffer for f in frames], self.config.limits, memo)
        except ProtocolViolation as exc:
            log.info("bad message from %s: %s", identity.hex(), exc.message)
            self._send(identity, [proto.encode_error(exc.code, exc.message)])
            return
        except Exception as exc:  # a decoder bug must not take the daemon down for everyone
            log.exception("internal error decoding a message from %s", identity.hex())
            self._send(identity, [proto.encode_error(ErrorCode.INTERNAL, f"internal error decoding: {exc}")])
            return
        if session is not None:
            session.last_seen = time.monotonic()
        try:
            match message:
                case proto.Batch() if session is not None:
                    await session.run_batch(message, received_at)
                case proto.Ping() if session is not None:
                    self._send(identity, [proto.PONG])
                case proto.Hello():
                    self._hello(identity, message)
                case proto.Bye():
                    self._end_session(identity)
                case _:
                    self._send(identity, [proto.encode_error(ErrorCode.SESSION, "no session: send hello first")])
        except Exception as exc:  # a bug must not take the daemon down for everyone
            log.exception("internal error handling a message from %s", identity.hex())
            self._send(identity, [proto.encode_error(ErrorCode.INTERNAL, f"internal error: {exc}")])

    def _hello(self, identity: bytes, hello: proto.Hello) -> None:
        assert self.backend is not None and self._scheduler is not None and self._residents is not None
        if hello.version != proto.PROTOCOL_VERSION:
            message = f"protocol version {hello.version} unsupported; this daemon speaks {proto.PROTOCOL_VERSION}"
            self._send(identity, [proto.encode_error(ErrorCode.PROTOCOL, message)])
            return
        self._end_session(identity)  # a reconnect with the same identity starts afresh
        session_id = secrets.token_hex(8)

        def send(frames: list[Any]) -> None:
            self._send(identity, frames)

        self.sessions[identity] = Session(
            session_id, f"{hello.name}[{hello.pid}]", send, self._scheduler, self._residents, self.config
        )
        log.info("session %s opened by %s[%s]", session_id, hello.name, hello.pid)
        welcome = {
            "t": "welcome",
            "v": proto.PROTOCOL_VERSION,
            "session": session_id,
            "daemon": __version__,
            "backend": self.backend.name,
            "devices": [self.backend.device_info()],
            "limits": self.config.limits.as_dict(),
            "lease_s": self.config.lease_s,
            "max_requests": self.config.session_max_requests,
        }
        self._send(identity, [proto.pack(welcome)])

    def _is_connected(self, session_id: str) -> bool:
        return any(session.id == session_id for session in self.sessions.values())

    def _end_session(self, identity: bytes) -> None:
        session = self.sessions.pop(identity, None)
        if session is not None:
            session.close()
            log.info("session %s (%s) closed", session.id, session.client)

    async def _lease_loop(self) -> None:
        lease = self.config.lease_s
        while True:
            await anyio.sleep(lease / 4)
            # Judge by the last time the socket was read empty, not by the clock: while the loop
            # is busy or throttled, heartbeats wait unread in the socket and prove nothing.
            drained = time.monotonic() if self._waiting else self._drained_at
            deadline = drained - lease
            for identity, session in list(self.sessions.items()):
                if session.last_seen < deadline:
                    log.info("session %s (%s) missed its lease", session.id, session.client)
                    self._end_session(identity)

    async def _signals(self) -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for _ in signals:
                log.info("signal received; shutting down")
                self.stop()
                return

    def _on_fatal(self, error: BaseException) -> None:
        if self._fatal is None:
            self._fatal = error
            log.critical("fatal device error: %s", error)
            for identity in list(self.sessions):
                self._send(identity, [proto.encode_error(ErrorCode.DEVICE_LOST, f"device lost: {error}")])
            self.stop()

    async def _shutdown(self) -> None:
        for identity in list(self.sessions):
            self._end_session(identity)
        if self._residents is not None:
            self._residents.clear()
        if self.backend is not None:
            with anyio.move_on_after(10):
                await self.backend.close()


def _round_robin(messages: list[list[Any]]) -> Iterator[tuple[bytes, list[Any]]]:
    """Interleave messages of different peers, keeping each peer's own order."""
    queues: OrderedDict[bytes, list[list[Any]]] = OrderedDict()
    for identity, *frames in messages:
        queues.setdefault(identity.bytes, []).append(frames)
    while queues:
        for identity in list(queues):
            pending = queues[identity]
            yield identity, pending.pop(0)
            if not pending:
                del queues[identity]


@contextlib.contextmanager
def _ipc_endpoint(path: Path) -> Iterator[None]:
    """Hold a lock file beside the socket: a second daemon must not silently take our clients."""
    if len(str(path)) > 107:
        raise ValueError(f"ipc path {path} is longer than the 107 bytes a unix socket allows")
    path.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
    lock_path = path.with_name(path.name + ".lock")
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o660)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "another process"
            raise AddressInUse(f"ipc://{path} is already served by gpud (pid {holder})") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # a stale socket of a daemon that died; we hold the lock
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            if _lock_held(fd):
                path.unlink()
        os.close(fd)


def _lock_held(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


async def run(config: Config) -> int:
    return await Server(config).serve()


def main_loop(config: Config) -> int:
    """Run the daemon on uvloop when it is installed (config `event_loop`), else on asyncio's loop."""
    if config.event_loop not in ("auto", "asyncio", "uvloop"):
        raise ValueError(f"event_loop must be auto, asyncio or uvloop, not {config.event_loop!r}")
    if config.event_loop != "asyncio":
        try:
            import uvloop
        except ImportError:
            if config.event_loop == "uvloop":
                raise
        else:
            return uvloop.run(run(config))  # type: ignore[no-any-return]
    return asyncio.run(run(config))

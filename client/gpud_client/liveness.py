"""Liveness: the connection as the client uses it, its heartbeats, and the detection of a daemon
that went away (DaemonLost) or ended the session (SessionLost).

Heartbeats come from a thread with a socket of its own, carrying the session's beat key: a client
whose event loop is blocked (tokenizing, loading a model, a breakpoint) keeps its session, while
the session of a process that died still ends one lease after its death.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.to_thread
import zmq
from zmq.utils.monitor import parse_monitor_message

import gpud_protocol as proto
from gpud_client.errors import DaemonLost, SessionLost
from gpud_client.ring import attach as attach_ring
from gpud_client.ring import supported as ring_supported
from gpud_client.rpc import Rpc
from gpud_client.transport import HANDSHAKE_TIMEOUT_S, SEND_QUEUE_MESSAGES, check_listening
from gpud_protocol.reader import SocketReader

RING_SPIN_US = 1000.0  # with a ring, how long a request polls for its reply by default


class Connection(Rpc):
    """One session's connection: requests and replies (Rpc), kept alive and watched."""

    def __init__(self, sock: zmq.Socket[bytes], address: str, spin_us: float = 0.0) -> None:
        super().__init__(sock, address, spin_us)
        self._beats: _BeatThread | None = None
        self.server_public_key: bytes | None = None

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

    async def attach_ring(self, spin_us: float) -> None:
        """Take the session's shared-memory ring if the daemon offers one (else stay on ZeroMQ alone);
        with it, spin `spin_us` (default `RING_SPIN_US`) for each reply."""
        session, key = str(self.welcome.get("session", "")), str(self.welcome.get("key", ""))
        self.ring = await anyio.to_thread.run_sync(attach_ring, self.address, session, key)
        if self.ring is not None:
            self._spin_s = (spin_us or RING_SPIN_US) / 1e6

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

    async def close(self) -> None:
        """Send what is queued and say bye; the daemon frees this session's private resources."""
        if self._beats is not None:
            self._beats.stop()
        if self.lost is None:
            self.send_batch()
            with anyio.move_on_after(5):
                await self.send_held()
                if self.ring is not None:  # the bye goes by ZeroMQ: it must not overtake the ring
                    await self._all_confirmed()
            self._send_control(proto.BYE)
        self.mark_lost(DaemonLost("the connection is closed"))


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


@contextlib.asynccontextmanager
async def open_connection(
    address: str,
    *,
    timeout: float = HANDSHAKE_TIMEOUT_S,
    server_public_key: bytes | None = None,
    spin_us: float = 0.0,
    device: int | None = None,
    ring: bool = False,
) -> AsyncIterator[Connection]:
    """A session with the daemon at `address`; a process-per-device front's redirect is followed once:
    this socket closed, the session opened at the worker it names instead."""
    async with _connection(address, timeout, server_public_key, spin_us, device, ring, True) as connection:
        redirect = connection.redirect
        if redirect is None:
            yield connection
            return
    async with _connection(redirect.address, timeout, None, spin_us, redirect.device, ring, False) as connection:
        yield connection


@contextlib.asynccontextmanager
async def _connection(
    address: str,
    timeout: float,
    server_public_key: bytes | None,
    spin_us: float,
    device: int | None,
    ring: bool,
    may_redirect: bool,
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
    connection.may_redirect = may_redirect
    error: BaseException | None = None
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(connection.reader)
            tg.start_soon(connection.watch_disconnect, monitor)
            await connection.handshake(timeout, device)
            redirected = connection.redirect is not None  # no session here: the caller goes to the worker
            if ring and ring_supported(address) and not redirected:
                await connection.attach_ring(spin_us)
            if not redirected:
                connection.start_beats(ctx)
                tg.start_soon(connection.heartbeat)
            try:
                yield connection
            finally:
                if not redirected:
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
        if connection.ring is not None:
            connection.ring.close()
            connection.ring = None
        if connection._beats is not None:
            connection._beats.stop()
        sock.disable_monitor()
        monitor.close(linger=0)
        sock.close(linger=0)
        ctx.term()
    if error is not None:
        raise error

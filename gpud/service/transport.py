"""The daemon's socket: a ZeroMQ ROUTER on ipc:// (beside a lock file) or tcp:// (CURVE), and its two ends.

In: the socket read in slices (intake.py). Out: per-peer outboxes that never block (peers.py), retried
by `retry_loop`. Beside the socket, sessions on this host may take a shared-memory ring (rings.py,
handed out by ring_server.py): small messages then travel through it both ways. The ROUTER's
per-peer send queue is small and ROUTER_MANDATORY is on, so a peer that does not read makes its own
outbox grow, never the daemon wait.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import zmq
import zmq.auth

from gpud.service.config import Config
from gpud.service.intake import Intake
from gpud.service.peers import Outboxes
from gpud.service.ring_server import Authenticate, RingServer
from gpud.service.rings import Put, Rings
from gpud_protocol.reader import SocketReader
from gpud_protocol.ring import DOORBELL

log = logging.getLogger(__name__)

PEER_SEND_QUEUE = 64  # messages ZeroMQ queues per peer; more wait in the peer's outbox


class AddressInUse(RuntimeError):
    """Another gpud serves this ipc:// path."""


class Transport:
    def __init__(self, config: Config, on_stuck: Callable[[bytes, str], None]) -> None:
        self.config = config
        self._on_stuck = on_stuck  # (identity, reason): the peer does not read its replies
        self._ctx = zmq.Context()
        self._intake: Intake | None = None
        self._outboxes: Outboxes | None = None
        self.rings = Rings(config.ring_spin_us, on_stuck)
        self.authenticate: Authenticate = lambda _session, _key: None  # the registry's, once wired
        self.linger_ms = 0  # on close: how long ZeroMQ may still send the last replies

    @contextlib.contextmanager
    def listening(self) -> Iterator[None]:
        """Bind the socket; on the way out close it (and the lock file), leaving `linger_ms` for the last replies."""
        config = self.config
        address, limits = config.address, config.limits
        sock = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.setsockopt(zmq.SNDHWM, PEER_SEND_QUEUE)
        sock.setsockopt(zmq.RCVHWM, 1024)
        sock.setsockopt(zmq.MAXMSGSIZE, max(limits.max_message_bytes, limits.max_header_bytes) + 4096)
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
            if address.startswith("ipc://") and config.ring_bytes:
                ring_server = RingServer(
                    Path(address[len("ipc://") :] + ".ring"),
                    self.rings,
                    lambda session, key: self.authenticate(session, key),
                    config.ring_bytes,
                    min(config.ring_bytes // 2, config.limits.reply_part_bytes - 1),
                    config.session_window,
                )
                stack.callback(ring_server.close)
            stack.callback(self._close_rings)
            reader = SocketReader(sock)
            self._intake = Intake(reader, config.busy_poll_us, self.rings)
            self._outboxes = Outboxes(
                sock,
                reader.poke,
                self._on_stuck,
                config.session_reply_bytes,
                config.lease_s,
                config.sessionless_reply_bytes,
            )
            try:
                yield
            finally:
                reader.close()
                sock.close(linger=self.linger_ms)  # a drain's last replies may still be on their way
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

    @property
    def intake(self) -> Intake:
        assert self._intake is not None, "the socket is not bound"
        return self._intake

    def send(self, identity: bytes, frames: list[Any], sessionless: bool, ring: bool = True) -> None:
        """Send now, or queue in the peer's outbox; a peer without a session has the smaller outbox.
        `ring`: the session's ring may carry it (not for messages that must stay in order with others)."""
        assert self._outboxes is not None
        if self.rings and not sessionless and identity in self.rings:
            assert self._intake is not None
            self._intake.rouse()  # its next request tends to follow
            put = self.rings.send(identity, frames) if ring else Put.NOWHERE
            if put is not Put.NOWHERE:
                if put is Put.BELL:
                    self._outboxes.send(identity, [DOORBELL], False)
                return
        self._outboxes.send(identity, frames, sessionless)

    def drop(self, identity: bytes) -> None:
        """Forget what waits for a peer (its session ended)."""
        if self._outboxes is not None:
            self._outboxes.drop(identity)

    def drop_ring(self, identity: bytes) -> None:
        self.rings.drop(identity)

    def _close_rings(self) -> None:
        for identity in list(self.rings.identities()):
            self.rings.drop(identity)

    def waiting(self) -> bool:
        """Replies still wait in some peer's outbox."""
        return bool(self._outboxes)

    def stats(self) -> dict[str, Any]:
        return self._outboxes.stats() if self._outboxes is not None else {}

    @property
    def sessionless_dropped(self) -> int:
        return self._outboxes.sessionless_dropped if self._outboxes is not None else 0

    async def retry_loop(self) -> None:
        """Retry what waits in the outboxes: often while something waits, rarely otherwise."""
        assert self._outboxes is not None
        outboxes = self._outboxes
        while True:
            await anyio.sleep(0.0005 if outboxes else 0.05)
            if outboxes:
                outboxes.retry()


@contextlib.contextmanager
def ipc_endpoint(path: Path) -> Iterator[None]:
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

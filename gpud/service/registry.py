"""The sessions: opened by a hello, kept alive by any message or a beat, ended by a bye, a lease, or a stuck peer.

A session is found by the peer identity its messages come from and by its id (heartbeats from the
client's other socket name the id and carry the session's secret key). A session's lease expires when
no message of its peer was read for `lease_s`; why a session ended is remembered for a while, so that
its peer's next message is answered with the reason rather than "send hello first".
"""

from __future__ import annotations

import hmac
import logging
import secrets
import time
from collections import defaultdict
from typing import Any, NamedTuple

import anyio

import gpud_protocol as proto
from gpud import __version__
from gpud.runtime.cache import LruCache
from gpud.service.config import Config
from gpud.service.transport import Transport
from gpud.session.session import Daemon, Session
from gpud.session.state import other_process
from gpud_protocol import ErrorCode

log = logging.getLogger(__name__)


class Client(NamedTuple):
    """Who opened a session, as its hello said."""

    name: str
    pid: int
    opened: float  # time.monotonic()


class Registry:
    def __init__(self, config: Config, daemon: Daemon, transport: Transport, counters: defaultdict[str, int]) -> None:
        self.config = config
        self._daemon = daemon  # what the sessions run on
        self._transport = transport
        self._counters = counters
        self.sessions: dict[bytes, Session] = {}  # by peer identity
        self._by_id: dict[str, Session] = {}
        self._ended: LruCache[bytes, str] = LruCache(4096)  # identity -> why its session ended
        self.clients: dict[str, Client] = {}  # by session id

    def send(self, identity: bytes, frames: list[Any]) -> None:
        """Reply to a peer: within its session's bounds, or the smaller ones of a peer without a session."""
        self._transport.send(identity, frames, identity not in self.sessions)

    def is_connected(self, session_id: str) -> bool:
        return session_id in self._by_id

    def ended(self, identity: bytes) -> str | None:
        """Why the last session of this peer ended, if it is still remembered."""
        return self._ended.get(identity)

    def hello(self, identity: bytes, hello: proto.Hello) -> None:
        config = self.config
        runtimes = self._daemon.runtimes
        if hello.version != proto.PROTOCOL_VERSION:
            message = f"protocol version {hello.version} unsupported; this daemon speaks {proto.PROTOCOL_VERSION}"
            self.send(identity, [proto.encode_error(ErrorCode.PROTOCOL, message)])
            return
        self.end(identity, "reconnected")  # a reconnect with the same identity starts afresh
        if len(self.sessions) >= config.max_sessions:
            self.send(identity, [proto.encode_error(ErrorCode.BUSY, f"{config.max_sessions} sessions: no room")])
            return
        first = runtimes[0]
        asked = None if hello.device is None else hello.device - (first.number - first.index)
        if asked is not None and not 0 <= asked < len(runtimes):
            text = f"no device {hello.device}: this daemon has {len(runtimes)}"
            if first.others_elsewhere:
                text = other_process(hello.device or 0, first.number)
            self.send(identity, [proto.encode_error(ErrorCode.INVALID_ARGUMENT, text)])
            return
        device = asked if asked is not None else self._least_loaded()
        session_id = secrets.token_hex(8)

        def send(frames: list[Any]) -> None:
            self.send(identity, frames)

        session = Session(session_id, f"{hello.name}[{hello.pid}]", send, self._daemon, config, device)
        session.send_in_order = lambda frames: self._transport.send(identity, frames, False, ring=False)
        session.beat_key = secrets.token_hex(16)
        self.sessions[identity] = session
        self._by_id[session_id] = session
        runtimes[device].sessions += 1
        self.clients[session_id] = Client(hello.name, hello.pid, time.monotonic())
        self._counters["sessions_opened"] += 1
        number = runtimes[device].number
        log.info("session %s opened by %s (pid %s) on device %d", session_id, hello.name or "?", hello.pid, number)
        welcome = {
            "t": "welcome",
            "v": proto.PROTOCOL_VERSION,
            "session": session_id,
            "key": session.beat_key,
            "daemon": __version__,
            "backend": runtimes[0].device.kind,
            "devices": [rt.info() for rt in runtimes],
            "device": number,
            "process_per_device": first.others_elsewhere,  # a worker: its one device, the others elsewhere
            "limits": config.limits.as_dict(),
            "memory_quota": config.session_memory_bytes,  # per device; 0: none
            "lease_s": config.lease_s,
            "max_requests": config.session_max_requests,
            "window": config.session_window,
        }
        self.send(identity, [proto.pack(welcome)])

    def _least_loaded(self) -> int:
        return min(self._daemon.runtimes, key=lambda rt: (rt.sessions, rt.memory_in_use, rt.index)).index

    def authenticate(self, session_id: str, key: str) -> bytes | None:
        """The peer identity of session `session_id` if `key` is its secret (the ring socket's check)."""
        session = self._by_id.get(session_id)
        if session is None or not hmac.compare_digest(session.beat_key.encode(), key.encode()):
            return None
        return next((identity for identity, s in self.sessions.items() if s is session), None)

    def beat(self, identity: bytes, beat: proto.Beat) -> None:
        session = self._by_id.get(beat.session)
        if session is None or not hmac.compare_digest(session.beat_key.encode(), beat.key.encode()):
            self.send(identity, [proto.encode_error(ErrorCode.SESSION, "no such session")])
            return
        session.last_seen = time.monotonic()

    def end(self, identity: bytes, reason: str) -> None:
        session = self.sessions.pop(identity, None)
        self._transport.drop_ring(identity)
        if reason != "reconnected":
            self._transport.drop(identity)
        if session is None:
            return
        self._by_id.pop(session.id, None)
        self._daemon.runtimes[session.device].sessions -= 1
        session.close()
        self._ended.put(identity, reason)
        self._counters["sessions_ended"] += 1
        name, pid, opened = self.clients.pop(session.id, Client("?", 0, time.monotonic()))
        log.info(
            "session %s of %s (pid %s) ended after %.1f s: %s",
            session.id,
            name or "?",
            pid,
            time.monotonic() - opened,
            reason,
        )

    async def lease_loop(self) -> None:
        lease = self.config.lease_s
        intake = self._transport.intake
        while True:
            await anyio.sleep(lease / 4)
            # Judge by the last time every waiting message had been read, not by the clock: while
            # the loop is behind, heartbeats wait unread in the socket and prove nothing.
            deadline = intake.caught_up() - lease
            for identity, session in list(self.sessions.items()):
                if session.last_seen < deadline:
                    self.end(identity, f"its lease expired (no message for {lease:.1f} s)")

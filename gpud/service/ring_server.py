"""Handing each session its ring: a unix socket beside the daemon's, `<socket>.ring`.

A client that wants the fast path connects after its hello and sends `{"session": id, "key": beat
key}` (msgpack, one packet). The daemon makes the segment — a memfd, sealed so that nobody can grow
or shrink it (a shrunk mapping would fault the daemon) — and sends its descriptor back with
SCM_RIGHTS, then closes the connection. Only that client holds the descriptor: no name in /dev/shm
for another user of the socket's group to open. Everything happens on the event loop without
blocking: the sockets are non-blocking, a connection that says nothing within `TIMEOUT_S` is closed,
and at most `MAX_PENDING` connections wait at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import mmap
import os
import socket
from collections.abc import Callable
from pathlib import Path

import msgpack

from gpud.service.rings import Rings, SessionRing
from gpud_protocol import ring as ring_layout
from gpud_protocol.wire import pack

log = logging.getLogger(__name__)

MAX_PENDING = 16
TIMEOUT_S = 2.0
REQUEST_BYTES = 512

Authenticate = Callable[[str, str], bytes | None]  # (session id, key) -> the session's peer identity


class RingServer:
    def __init__(
        self, path: Path, rings: Rings, authenticate: Authenticate, capacity: int, max_message: int, window: int
    ) -> None:
        ring_layout.check_capacity(capacity)
        self.path = path
        self._rings = rings
        self._authenticate = authenticate
        self._capacity = capacity
        self._max_message = max_message
        self._window = window
        self._loop = asyncio.get_running_loop()
        self._pending: dict[socket.socket, asyncio.TimerHandle] = {}
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(path))
        os.chmod(path, 0o660)
        self._listener.listen(MAX_PENDING)
        self._listener.setblocking(False)
        self._loop.add_reader(self._listener.fileno(), self._accept)

    def close(self) -> None:
        self._loop.remove_reader(self._listener.fileno())
        self._listener.close()
        for conn in list(self._pending):
            self._forget(conn)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def _accept(self) -> None:
        try:
            conn, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            log.warning("ring socket: accept failed: %s", exc)
            return
        if len(self._pending) >= MAX_PENDING:
            conn.close()
            return
        conn.setblocking(False)
        self._pending[conn] = self._loop.call_later(TIMEOUT_S, self._forget, conn)
        self._loop.add_reader(conn.fileno(), self._request, conn)

    def _forget(self, conn: socket.socket) -> None:
        timer = self._pending.pop(conn, None)
        if timer is not None:
            timer.cancel()
            self._loop.remove_reader(conn.fileno())
        conn.close()

    def _request(self, conn: socket.socket) -> None:
        try:
            data = conn.recv(REQUEST_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._forget(conn)
            return
        try:
            self._answer(conn, data)
        finally:
            self._forget(conn)

    def _answer(self, conn: socket.socket, data: bytes) -> None:
        try:
            request = msgpack.unpackb(data, raw=False, max_str_len=128, max_bin_len=0, max_array_len=4, max_map_len=4)
        except Exception:
            request = None
        if not isinstance(request, dict) or not all(isinstance(request.get(k), str) for k in ("session", "key")):
            _reply(conn, {"ok": False, "msg": "expected {session, key}"})
            return
        identity = self._authenticate(request["session"], request["key"])
        if identity is None:
            _reply(conn, {"ok": False, "msg": "no such session"})
            return
        try:
            fd, segment = _segment(self._capacity)
        except OSError as exc:
            log.warning("ring for session %s: %s", request["session"], exc)
            _reply(conn, {"ok": False, "msg": f"no ring: {exc}"})
            return
        try:
            ring = SessionRing(identity, segment, self._max_message, self._window)
            if _reply(conn, {"ok": True, "capacity": self._capacity, "max_message": ring.requests.max_message}, fd):
                self._rings.attach(ring)
            else:
                ring.close()
        finally:
            os.close(fd)


def _segment(capacity: int) -> tuple[int, mmap.mmap]:
    """A sealed memfd of two rings and its mapping."""
    size = ring_layout.segment_bytes(capacity)
    fd = os.memfd_create("gpud-ring", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
        segment = mmap.mmap(fd, size)
        ring_layout.format_segment(segment, capacity)
    except BaseException:
        os.close(fd)
        raise
    return fd, segment


def _reply(conn: socket.socket, message: dict[str, object], fd: int | None = None) -> bool:
    try:
        socket.send_fds(conn, [pack(message)], [] if fd is None else [fd])
    except OSError:
        return False
    return True

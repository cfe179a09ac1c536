"""The client's end of its session's shared-memory ring (`gpud_protocol.ring`): the same-host fast path.

After the welcome, a client that asked for it (`connect(ring=True)` or `GPUD_RING=1`) connects to
the daemon's ring socket (`<socket>.ring`), proves who it is with the session's key and gets the
segment's descriptor back. From then on batches go into the request ring (ZeroMQ still takes what
does not fit), and while the client spins for a reply it tells the daemon so, which then writes small
replies into the reply ring. Only on x86-64 (the ring relies on its store order) and on ipc://.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import platform
import socket
import time
from typing import Any

import msgpack

from gpud_protocol.ring import CLIENT_POLLS_UNTIL, DAEMON_POLLS_UNTIL, MARGIN_NS, Ring, RingFrame, segment_bytes

TIMEOUT_S = 2.0


class ClientRing:
    def __init__(self, segment: mmap.mmap, max_message: int) -> None:
        self._segment = segment
        self.requests = Ring(segment, requests=True, producer=True, max_message=max_message)
        self.replies = Ring(segment, requests=False, producer=False, max_message=max_message)

    def send(self, frames: list[Any]) -> bool | None:
        """Write a message: None if it went nowhere (too large, or the ring is full: use ZeroMQ),
        True if the daemon polls (nothing more to do), False if it sleeps (ring the doorbell)."""
        if not self.requests.produce(frames):
            return None
        return self.requests.get_slot(DAEMON_POLLS_UNTIL) >= time.monotonic_ns() + MARGIN_NS

    def poll(self) -> list[RingFrame] | None:
        """The next reply, in writable memory of its own (its arrays need no copy)."""
        return self.replies.consume(writable=True)

    def listen(self, until_ns: int) -> None:
        """Until when this client reads the reply ring (0: not now; replies come by ZeroMQ)."""
        self.replies.set_slot(CLIENT_POLLS_UNTIL, until_ns)

    def close(self) -> None:
        self.requests.release()
        self.replies.release()
        self._segment.close()


def supported(address: str) -> bool:
    return address.startswith("ipc://") and platform.machine() in ("x86_64", "AMD64")


def attach(address: str, session: str, key: str) -> ClientRing | None:
    """Ask the daemon at `address` for this session's ring; None if it offers none (an older or
    configured-off daemon, no such socket)."""
    path = address[len("ipc://") :] + ".ring"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(TIMEOUT_S)
        try:
            conn.connect(path)
            conn.sendall(msgpack.packb({"session": session, "key": key}))
            data, fds, _flags, _addr = socket.recv_fds(conn, 512, 1)
        except OSError:
            return None
    try:
        answer = msgpack.unpackb(data, raw=False)
        if not isinstance(answer, dict) or not answer.get("ok") or len(fds) != 1:
            return None
        capacity, max_message = int(answer["capacity"]), int(answer["max_message"])
        segment = mmap.mmap(fds[0], segment_bytes(capacity))
    except (ValueError, KeyError, TypeError, OSError, msgpack.UnpackException):
        return None
    finally:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
    try:
        return ClientRing(segment, max_message)
    except Exception:
        segment.close()
        raise

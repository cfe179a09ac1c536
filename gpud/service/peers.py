"""Sending to clients without ever blocking, and without holding unbounded bytes for them.

The ROUTER socket has a small per-peer send queue (`SNDHWM`) and ROUTER_MANDATORY, so a send to a
peer that does not read fails with EAGAIN instead of queueing without bound (or being dropped).
Such messages wait in the peer's outbox, in order, and are retried. A peer whose outbox holds
more than `max_bytes`, or has not moved for `stall_s`, is not reading its replies: its session is
ended. Replies are at most one readback part each, so the bytes a peer can hold in the daemon are
bounded by `SNDHWM` parts plus `max_bytes`.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import zmq

log = logging.getLogger(__name__)


class Outboxes:
    def __init__(
        self,
        sock: zmq.Socket[bytes],
        on_sent: Callable[[], None],
        on_stuck: Callable[[bytes, str], None],
        max_bytes: int,
        stall_s: float,
    ) -> None:
        self._sock = sock
        self._on_sent = on_sent  # the socket reader's poke: a send may consume the edge of an incoming message
        self._on_stuck = on_stuck  # (identity, reason): the peer does not read, or is gone
        self.max_bytes = max_bytes
        self.stall_s = stall_s
        self._boxes: dict[bytes, _Box] = {}
        self.waiting_sends = 0

    def __bool__(self) -> bool:
        return bool(self._boxes)

    def send(self, identity: bytes, frames: list[Any]) -> None:
        box = self._boxes.get(identity)
        if box is None:
            result = self._try(identity, frames)
            if result is None:
                return
            if result:
                self._on_stuck(identity, result)
                return
            box = self._boxes[identity] = _Box()
        box.append(frames)
        self.waiting_sends += 1
        if box.nbytes > self.max_bytes:
            self.drop(identity)
            self._on_stuck(identity, f"more than {self.max_bytes} bytes of replies wait unread")

    def retry(self) -> None:
        """Send what waits; end the sessions of peers that have not read anything for too long."""
        now = time.monotonic()
        for identity in list(self._boxes):
            box = self._boxes[identity]
            while box.items:
                result = self._try(identity, box.items[0])
                if result is None:
                    box.pop()
                    continue
                if result or now - box.moved_at > self.stall_s:
                    self.drop(identity)
                    self._on_stuck(identity, result or f"did not read its replies for {self.stall_s:.1f} s")
                break
            else:
                del self._boxes[identity]

    def drop(self, identity: bytes) -> None:
        self._boxes.pop(identity, None)

    def _try(self, identity: bytes, frames: list[Any]) -> str | None:
        """None: sent. "": the peer's queue is full. Else why the peer is unreachable."""
        try:
            self._sock.send_multipart([identity, *frames], flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return ""
        except zmq.ZMQError as exc:  # EHOSTUNREACH: the peer is gone
            return f"unreachable ({exc})"
        self._on_sent()
        return None

    def stats(self) -> dict[str, int]:
        return {
            "peers_waiting": len(self._boxes),
            "bytes_waiting": sum(box.nbytes for box in self._boxes.values()),
            "waiting_sends": self.waiting_sends,
        }


class _Box:
    __slots__ = ("items", "moved_at", "nbytes")

    def __init__(self) -> None:
        self.items: deque[list[Any]] = deque()
        self.nbytes = 0
        self.moved_at = time.monotonic()

    def append(self, frames: list[Any]) -> None:
        self.items.append(frames)
        self.nbytes += _size(frames)

    def pop(self) -> None:
        self.nbytes -= _size(self.items.popleft())
        self.moved_at = time.monotonic()


def _size(frames: list[Any]) -> int:
    return sum(f.nbytes if isinstance(f, memoryview) else len(f) for f in frames)

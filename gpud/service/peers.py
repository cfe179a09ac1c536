"""Sending to clients without ever blocking, and without holding unbounded bytes for them.

The ROUTER socket has a small per-peer send queue (`SNDHWM`) and ROUTER_MANDATORY, so a send to a
peer that does not read fails with EAGAIN instead of queueing without bound (or being dropped).
Such messages wait in the peer's outbox, in order, and are retried. A peer whose outbox holds
more than `max_bytes`, or has not moved for `stall_s`, is not reading its replies: its session is
ended. Replies are at most one readback part each, so the bytes a peer can hold in the daemon are
bounded by `SNDHWM` parts plus `max_bytes`.

A peer without a session (a status request, garbage, a failed hello) had no op accepted, so its
replies may be dropped: at most `sessionless_bytes` wait for one such peer, and `SESSIONLESS_BOXES`
times that for all of them; a reply past either is dropped and counted, and nothing is ended.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import zmq

log = logging.getLogger(__name__)

SESSIONLESS_BOXES = 16  # peers without a session: all their outboxes together hold this many peers' worth


class Outboxes:
    def __init__(
        self,
        sock: zmq.Socket[bytes],
        on_sent: Callable[[], None],
        on_stuck: Callable[[bytes, str], None],
        max_bytes: int,
        stall_s: float,
        sessionless_bytes: int = 1 << 20,
    ) -> None:
        self._sock = sock
        self._on_sent = on_sent  # the socket reader's poke: a send may consume the edge of an incoming message
        self._on_stuck = on_stuck  # (identity, reason): the peer does not read, or is gone
        self.max_bytes = max_bytes
        self.stall_s = stall_s
        self.sessionless_bytes = sessionless_bytes
        self._boxes: dict[bytes, _Box] = {}
        self.waiting_sends = 0
        self.sessionless_waiting = 0  # bytes waiting for peers without a session
        self.sessionless_dropped = 0  # replies to such peers dropped at those bounds

    def __bool__(self) -> bool:
        return bool(self._boxes)

    def send(self, identity: bytes, frames: list[Any], sessionless: bool = False) -> None:
        box = self._boxes.get(identity)
        if box is None:
            result = self._try(identity, frames)
            if result is None:
                return
            if result:
                self._on_stuck(identity, result)
                return
            box = self._boxes[identity] = _Box(sessionless)
        elif box.sessionless and not sessionless:  # the peer said hello: a session's rules from now on
            self.sessionless_waiting -= box.nbytes
            box.sessionless = False
        # A session's box still waiting after its session ended keeps a session's rules until it empties.
        if box.sessionless:
            size = _size(frames)
            if box.nbytes + size > self.sessionless_bytes or (
                self.sessionless_waiting + size > SESSIONLESS_BOXES * self.sessionless_bytes
            ):
                self.sessionless_dropped += 1
                if not box.items:
                    del self._boxes[identity]
                return
            self.sessionless_waiting += size
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
                    size = box.pop()
                    if box.sessionless:
                        self.sessionless_waiting -= size
                    continue
                if result or now - box.moved_at > self.stall_s:
                    self.drop(identity)
                    self._on_stuck(identity, result or f"did not read its replies for {self.stall_s:.1f} s")
                break
            else:
                del self._boxes[identity]

    def drop(self, identity: bytes) -> None:
        box = self._boxes.pop(identity, None)
        if box is not None and box.sessionless:
            self.sessionless_waiting -= box.nbytes

    def _try(self, identity: bytes, frames: list[Any]) -> str | None:
        """None: sent. "": the peer's queue is full. Else why the peer is unreachable."""
        try:
            self._sock.send_multipart([identity, *frames], flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return ""
        except zmq.ZMQError as exc:  # EHOSTUNREACH: the peer is gone
            return f"unreachable ({exc})"
        finally:  # a send that fails processes the socket's commands too, and may take the reader's edge
            self._on_sent()
        return None

    def stats(self) -> dict[str, int]:
        return {
            "peers_waiting": len(self._boxes),
            "bytes_waiting": sum(box.nbytes for box in self._boxes.values()),
            "waiting_sends": self.waiting_sends,
            "sessionless_bytes_waiting": self.sessionless_waiting,
            # the most waiting for one such peer: at most `sessionless_bytes` (all of them, SESSIONLESS_BOXES times)
            "sessionless_most_bytes_waiting": max((b.nbytes for b in self._boxes.values() if b.sessionless), default=0),
            "sessionless_replies_dropped": self.sessionless_dropped,
        }


class _Box:
    __slots__ = ("items", "moved_at", "nbytes", "sessionless")

    def __init__(self, sessionless: bool) -> None:
        self.items: deque[list[Any]] = deque()
        self.nbytes = 0
        self.moved_at = time.monotonic()
        self.sessionless = sessionless

    def append(self, frames: list[Any]) -> None:
        self.items.append(frames)
        self.nbytes += _size(frames)

    def pop(self) -> int:
        size = _size(self.items.popleft())
        self.nbytes -= size
        self.moved_at = time.monotonic()
        return size


def _size(frames: list[Any]) -> int:
    return sum(f.nbytes if isinstance(f, memoryview) else len(f) for f in frames)

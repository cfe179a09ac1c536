"""The daemon's end of the sessions' shared-memory rings (the fast path: `gpud_protocol.ring`).

A session with a ring sends batches through it and gets small replies back through it; ZeroMQ still
carries its hello, pings, doorbells, large messages and anything a full ring cannot take. Batches may
so arrive by two ways: a ring session numbers its batches (1, 2, 3...), and `order` hands them to the
session in that order whatever way each came, holding at most `window` that arrived early.

The daemon polls the request rings at every slice of its receive loop, and busily for `spin_s` after
the last message before it sleeps; it publishes in each ring until when it polls, so a client that
finds that deadline passed rings a doorbell (`{"t": "ring"}`) over ZeroMQ. Replies go into a ring
while its client says it polls it. A client that sleeps gets a small reply over ZeroMQ, which wakes it,
but a large one (`BELL_BYTES` or more: a replay's outputs after a long GPU step) still goes into the ring,
with the same doorbell sent to it over ZeroMQ: a few bytes through the socket instead of the whole reply.

What a ring holds is checked like a socket frame; a broken ring ends its session alone.
"""

from __future__ import annotations

import mmap
import time
from collections.abc import Callable, Iterator
from enum import Enum
from typing import Any

from gpud_protocol import Batch
from gpud_protocol.ring import CLIENT_POLLS_UNTIL, DAEMON_POLLS_UNTIL, MARGIN_NS, Ring, RingCorrupt, RingFrame

BELL_BYTES = 64 << 10


class Put(Enum):
    """Where `SessionRing.offer` put a reply."""

    NOWHERE = 0  # send it by ZeroMQ
    POLLED = 1  # in the ring, which its client polls
    BELL = 2  # in the ring, and its client sleeps: ring the doorbell by ZeroMQ


class OutOfOrder(Exception):
    """A ring session's batch numbers skipped back, or ran further ahead than its window."""


class SessionRing:
    """One session's segment: its request ring (read here) and reply ring (written here)."""

    def __init__(self, identity: bytes, segment: mmap.mmap, max_message: int, window: int) -> None:
        self.identity = identity
        self._segment = segment
        self.requests = Ring(segment, requests=True, producer=False, max_message=max_message)
        self.replies = Ring(segment, requests=False, producer=True, max_message=max_message)
        self._window = window
        self._next = 1  # the batch number the session gets next
        self._early: dict[int, Batch] = {}
        self.messages_in = 0
        self.replies_out = 0
        self.bells_out = 0

    def order(self, batch: Batch) -> Iterator[Batch]:
        """The batches that may run now, in number order, once `batch` arrived."""
        number = batch.number
        if number != self._next:
            if number < self._next or number in self._early:
                raise OutOfOrder(f"batch {number} arrived twice or after batch {self._next - 1} ran")
            if number - self._next > self._window or len(self._early) >= self._window:
                raise OutOfOrder(f"batch {number} is more than {self._window} ahead of batch {self._next}")
            self._early[number] = batch
            return
        yield batch
        self._next += 1
        while (early := self._early.pop(self._next, None)) is not None:
            yield early
            self._next += 1

    def offer(self, frames: list[Any], now_ns: int) -> Put:
        """Put a reply in the ring if it fits and the client polls it or it is large."""
        replies = self.replies
        polled = replies.get_slot(CLIENT_POLLS_UNTIL) >= now_ns + MARGIN_NS
        if not polled and sum(memoryview(frame).nbytes for frame in frames) < BELL_BYTES:
            return Put.NOWHERE
        if not replies.produce(frames):
            return Put.NOWHERE
        self.replies_out += 1
        if polled:
            return Put.POLLED
        self.bells_out += 1
        return Put.BELL

    def close(self) -> None:
        self.requests.release()
        self.replies.release()
        self._segment.close()


class Rings:
    """Every ring session's ring, by peer identity."""

    def __init__(self, spin_us: float, on_broken: Callable[[bytes, str], None]) -> None:
        self.spin_s = spin_us / 1e6
        self._on_broken = on_broken  # (identity, reason): end that session
        self._rings: dict[bytes, SessionRing] = {}
        self.attached = 0

    def __bool__(self) -> bool:
        return bool(self._rings)

    def __len__(self) -> int:
        return len(self._rings)

    def __contains__(self, identity: object) -> bool:
        return identity in self._rings

    def identities(self) -> list[bytes]:
        return list(self._rings)

    def get(self, identity: bytes) -> SessionRing | None:
        return self._rings.get(identity)

    def attach(self, ring: SessionRing) -> None:
        self.drop(ring.identity)
        self._rings[ring.identity] = ring
        self.attached += 1

    def drop(self, identity: bytes) -> None:
        ring = self._rings.pop(identity, None)
        if ring is not None:
            ring.close()

    def poll(self, limit: int) -> list[tuple[bytes, list[RingFrame]]]:
        """Up to `limit` messages, round-robin over the rings (one from each in turn)."""
        messages: list[tuple[bytes, list[RingFrame]]] = []
        ready = [ring for ring in self._rings.values() if ring.requests.pending()]
        while ready and len(messages) < limit:
            still: list[SessionRing] = []
            for ring in ready:
                try:
                    frames = ring.requests.consume()
                except RingCorrupt as exc:
                    self.fail(ring.identity, f"its ring is broken: {exc}")
                    continue
                if frames is None:
                    continue
                ring.messages_in += 1
                messages.append((ring.identity, frames))
                if len(messages) >= limit:
                    break
                still.append(ring)
            ready = still
        return messages

    def awake_until(self, deadline_ns: int) -> None:
        """Tell every client until when the daemon polls (0: it sleeps; ring the doorbell)."""
        for ring in self._rings.values():
            ring.requests.set_slot(DAEMON_POLLS_UNTIL, deadline_ns)

    def send(self, identity: bytes, frames: list[Any]) -> Put:
        ring = self._rings.get(identity)
        if ring is None:
            return Put.NOWHERE
        try:
            return ring.offer(frames, time.monotonic_ns())
        except RingCorrupt as exc:
            self.fail(identity, f"its ring is broken: {exc}")
            return Put.NOWHERE

    def fail(self, identity: bytes, reason: str) -> None:
        self.drop(identity)
        self._on_broken(identity, reason)

    def stats(self) -> dict[str, int]:
        return {
            "ring_sessions": len(self._rings),
            "rings_attached": self.attached,
            "ring_messages_in": sum(r.messages_in for r in self._rings.values()),
            "ring_replies_out": sum(r.replies_out for r in self._rings.values()),
            "ring_bells_out": sum(r.bells_out for r in self._rings.values()),
        }

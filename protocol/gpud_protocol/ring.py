"""A session's shared-memory rings: the same-host fast path beside ZeroMQ.

One memory segment per session, made by the daemon (a sealed memfd: the client can neither grow nor
shrink it) and handed to that session's client alone over a unix socket. It holds two single-producer
single-consumer byte rings: requests (client -> daemon) and replies (daemon -> client). A record is
one message: an 8-byte head (body length, frame count), then the frame lengths (u32 each) and the
frames' bytes, padded to 8 bytes; a body may wrap around the ring's end, a head never does.

Each side owns its own indices (bytes produced or consumed since the start, never reduced modulo the
capacity) and keeps them in its own memory; the shared copies are only news for the other side.
Everything the consumer reads is checked like a socket frame: the peer's index inside the ring, the
head's length and frame count bounded, the body copied out of shared memory before it is parsed (the
peer cannot change it afterwards). A check that fails raises `RingCorrupt`: the session's own ring is
broken, and only that session ends. Records are published by storing the producer's index after the
record's bytes: on x86-64 stores become visible in program order, which this relies on (clients on
other architectures keep to ZeroMQ).

Besides the indices the header holds two deadlines (CLOCK_MONOTONIC nanoseconds, comparable across
processes): until when the daemon polls the request ring, and until when the client polls the reply
ring. A producer that finds its consumer's deadline passed (or near) rings a doorbell over ZeroMQ
instead (the daemon), or sends the message there (replies); a large reply goes into the ring all the
same, with that doorbell sent to the client.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any, NamedTuple

from gpud_protocol.wire import pack

MAGIC = 0x31474E5244555047  # b"GPUDRNG1", little-endian
HEADER_BYTES = 4096
MAX_FRAMES = 1025  # a batch header and `Limits.max_frames` payload frames
ALIGN = 8

# u64 slots of the header (each on a cache line of its own: the two sides write different ones)
_MAGIC, _REQUEST_CAPACITY, _REPLY_CAPACITY = 0, 1, 2
REQUEST_WRITTEN, REQUEST_READ, REPLY_WRITTEN, REPLY_READ = 8, 16, 24, 32
DAEMON_POLLS_UNTIL, CLIENT_POLLS_UNTIL = 40, 48

# Both ends: a polling deadline closer than MARGIN_NS counts as passed (the other side may be just
# leaving); a sleeping end still looks at its ring every CHECK_S, for a doorbell not needed by a hair.
MARGIN_NS = 200_000
CHECK_S = 0.005

_HEAD = struct.Struct("<II")

DOORBELL = pack({"t": "ring"})  # either way over ZeroMQ: look at this session's ring


class RingCorrupt(Exception):
    """What a ring holds breaks its rules (an index or record the producer could not have written)."""


class RingFrame(NamedTuple):
    """A frame read from a ring, shaped as a ZeroMQ frame is used here (`.buffer`)."""

    buffer: memoryview


def padded(size: int) -> int:
    return (size + ALIGN - 1) & ~(ALIGN - 1)


def segment_bytes(capacity: int) -> int:
    """The size of a segment with two rings of `capacity` bytes each."""
    return HEADER_BYTES + 2 * capacity


def check_capacity(capacity: int) -> None:
    if capacity < 4096 or capacity % ALIGN:
        raise ValueError(f"a ring holds at least 4096 bytes, a multiple of {ALIGN} (got {capacity})")


def format_segment(buffer: Any, capacity: int) -> None:
    """Write a fresh header (the daemon, before handing the segment over)."""
    check_capacity(capacity)
    words = memoryview(buffer).cast("B").cast("Q")
    try:
        words[_REQUEST_CAPACITY] = capacity
        words[_REPLY_CAPACITY] = capacity
        words[_MAGIC] = MAGIC
    finally:
        words.release()


class Ring:
    """One direction of a segment, seen from one side: `produce` on the producer's, `consume` on the
    consumer's. `max_message` bounds one record's body (larger messages go over ZeroMQ)."""

    def __init__(self, buffer: Any, *, requests: bool, producer: bool, max_message: int) -> None:
        raw = memoryview(buffer).cast("B")
        self._words = raw.cast("Q")
        if len(raw) < HEADER_BYTES or self._words[_MAGIC] != MAGIC:
            self.release()
            raise RingCorrupt("not a gpud ring segment")
        capacity = int(self._words[_REQUEST_CAPACITY if requests else _REPLY_CAPACITY])
        start = HEADER_BYTES if requests else HEADER_BYTES + int(self._words[_REQUEST_CAPACITY])
        if capacity < 4096 or capacity % ALIGN or start + capacity > len(raw):
            self.release()
            raise RingCorrupt(f"ring capacity {capacity} does not fit a segment of {len(raw)} bytes")
        self._data = raw[start : start + capacity]
        raw.release()
        self.capacity = capacity
        self.max_message = min(max_message, capacity // 2)
        self._written_slot = REQUEST_WRITTEN if requests else REPLY_WRITTEN
        self._read_slot = REQUEST_READ if requests else REPLY_READ
        self._producer = producer
        # Our own index, kept here: the shared copy is the other side's news, never read back.
        self._own = int(self._words[self._written_slot if producer else self._read_slot])
        self._peer_seen = int(self._words[self._read_slot if producer else self._written_slot])
        ahead = self._own - self._peer_seen if producer else self._peer_seen - self._own
        if not 0 <= ahead <= capacity:
            self.release()
            raise RingCorrupt("ring indices out of order")

    def release(self) -> None:
        """Let go of the segment (its mapping can then be closed)."""
        for view in ("_data", "_words"):
            if (mv := self.__dict__.get(view)) is not None:
                mv.release()

    # ------------------------------------------------------------------ deadlines

    def get_slot(self, slot: int) -> int:
        return int(self._words[slot])

    def set_slot(self, slot: int, value: int) -> None:
        self._words[slot] = value

    # ------------------------------------------------------------------ producing

    def produce(self, frames: Sequence[Any]) -> bool:
        """Write one message; False when it is larger than `max_message` or the ring lacks room."""
        count = len(frames)
        views = [memoryview(frame).cast("B") for frame in frames]
        lengths = [view.nbytes for view in views]
        body = 4 * count + sum(lengths)
        if body > self.max_message or not 0 < count <= MAX_FRAMES:
            return False
        read = int(self._words[self._read_slot])
        if not self._peer_seen <= read <= self._own:
            raise RingCorrupt(f"the consumer's index moved to {read} (was {self._peer_seen}, written {self._own})")
        self._peer_seen = read
        record = ALIGN + padded(body)
        if self._own + record - read > self.capacity:
            return False
        at = self._own % self.capacity
        _HEAD.pack_into(self._data, at, body, count)
        at = self._put((at + ALIGN) % self.capacity, struct.pack(f"<{count}I", *lengths))
        for view in views:
            at = self._put(at, view)
        self._own += record
        self._words[self._written_slot] = self._own  # publish: the record's bytes were stored first
        return True

    def _put(self, at: int, data: Any) -> int:
        view = memoryview(data)
        size = view.nbytes
        first = min(size, self.capacity - at)
        self._data[at : at + first] = view[:first]
        if first < size:
            self._data[: size - first] = view[first:]
        return (at + size) % self.capacity

    # ------------------------------------------------------------------ consuming

    def pending(self) -> bool:
        """Something was published and not yet consumed (cheap: one shared load)."""
        return int(self._words[self._written_slot]) != self._own

    def consume(self, writable: bool = False) -> list[RingFrame] | None:
        """The next message (frames copied out of shared memory, into memory of their own that may be
        written when `writable`), or None when the ring is empty."""
        written = int(self._words[self._written_slot])
        own, capacity = self._own, self.capacity
        if written == own:
            return None
        if not self._peer_seen <= written <= own + capacity:
            raise RingCorrupt(f"the producer's index moved to {written} (was {self._peer_seen}, read {own})")
        self._peer_seen = written
        at = own % capacity
        body, count = _HEAD.unpack_from(self._data, at)
        record = ALIGN + padded(body)
        if not 0 < count <= MAX_FRAMES or body > self.max_message or 4 * count > body or record > written - own:
            raise RingCorrupt(f"a record of {body} bytes in {count} frames does not fit (limit {self.max_message})")
        start = (at + ALIGN) % capacity
        first = min(body, capacity - start)
        data = (bytearray if writable else bytes)(self._data[start : start + first])
        if first < body:
            data += self._data[: body - first]
        view = memoryview(data)
        lengths = struct.unpack_from(f"<{count}I", data)
        if sum(lengths) != body - 4 * count:
            raise RingCorrupt("a record's frame lengths do not add up to its body")
        frames: list[RingFrame] = []
        offset = 4 * count
        for length in lengths:
            frames.append(RingFrame(view[offset : offset + length]))
            offset += length
        self._own = own + record
        self._words[self._read_slot] = self._own
        return frames

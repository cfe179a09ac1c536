"""Reading the daemon's socket in slices, so that the rest of the daemon always gets its turn.

A slice is what is ready, up to `MAX_DRAIN` messages. When a message is already waiting as the
next slice begins, the receive loop yields to the event loop first: otherwise a peer that sends
faster than the daemon reads would keep the socket from ever being empty, and completions, lease
expiry, health, outbox retries and other sessions' replies would wait for as long as it sent.

Ring sessions' messages (rings.py) come in the same slices: each slice takes what the rings hold
first, then the socket. While any ring session exists, the daemon polls rings and socket for
`ring_spin_us` after the last message before it sleeps, and tells the clients until when (so a client
rings the doorbell only when the daemon sleeps); asleep, it still looks at the rings every
`gpud_protocol.ring.CHECK_S`, in case a client's doorbell was not needed by a hair. A reply to a ring
session (`rouse()`) starts the polling again: that client's next request tends to follow its reply, and
after a request longer than the spin (a replay of a large batch) the daemon would otherwise sleep
through it and be woken by the doorbell.

Leases are judged by `caught_up()`: the last time every peer's waiting messages had been read up
to that point, so that a heartbeat still unread in the socket proves nothing either way. That is
when the socket was read empty, or when one slice read a peer twice: ZeroMQ's ROUTER reads its
peers in turn, one message each, so by then every peer with a message waiting had one read.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from gpud.service.rings import Rings
from gpud_protocol.reader import SocketReader
from gpud_protocol.ring import CHECK_S

MAX_DRAIN = 256  # messages taken per slice before the devices and the rest of the loop get a say

Message = tuple[bytes, list[Any]]  # (the peer's identity, the message's frames)


class Intake:
    def __init__(self, reader: SocketReader, busy_poll_us: float = 0.0, rings: Rings | None = None) -> None:
        self._reader = reader
        self._busy_poll_s = busy_poll_us / 1e6
        self._rings = rings if rings is not None else Rings(0.0, lambda _identity, _reason: None)
        self._waiting = False  # waiting on an empty socket
        self._roused = False  # asleep, told to poll again
        self._caught_up_at = time.monotonic()

    def rouse(self) -> None:
        """A ring session was answered: poll the rings again for `ring_spin_us` if asleep (loop thread)."""
        if self._waiting and not self._roused:
            self._roused = True
            self._reader.wake()

    def caught_up(self) -> float:
        """The last time (monotonic) every message that waited in the socket had been read."""
        return time.monotonic() if self._waiting else self._caught_up_at

    async def next_slice(self) -> list[Message]:
        """The next messages: waits for one, then takes what is ready, at most `MAX_DRAIN`."""
        reader, rings = self._reader, self._rings
        messages: list[Message] = rings.poll(MAX_DRAIN // 2) if rings else []
        frames = reader.try_recv()
        if frames is None and not messages:
            messages, frames = await self._next_message()
        else:
            await asyncio.sleep(0)  # the socket never ran dry: let the rest of the loop run first
        seen = {identity for identity, _ in messages}
        caught_up = frames is None
        if frames is not None:
            identity = frames[0].bytes
            seen.add(identity)
            messages.append((identity, frames[1:]))
        while len(messages) < MAX_DRAIN:
            if (frames := reader.try_recv()) is None:
                caught_up = True
                break
            identity = frames[0].bytes
            if identity in seen:
                caught_up = True
            else:
                seen.add(identity)
            messages.append((identity, frames[1:]))
        if caught_up:
            self._caught_up_at = time.monotonic()
        return messages

    async def _next_message(self) -> tuple[list[Message], list[Any] | None]:
        """Wait for a message (ring messages, or a socket message's frames); with `busy_poll_us`, or
        `ring_spin_us` while rings exist, poll for it first (lower latency, one busy core)."""
        while True:
            if (got := await self._spin()) is not None:
                return got
            self._waiting = True  # the socket is empty for as long as this waits
            try:
                if (got := await self._sleep()) is not None:
                    return got
            finally:
                self._waiting = self._roused = False

    async def _spin(self) -> tuple[list[Message], list[Any] | None] | None:
        reader, rings = self._reader, self._rings
        spin_s = max(self._busy_poll_s, rings.spin_s if rings else 0.0)
        if spin_s > 0:
            deadline = time.perf_counter() + spin_s
            if rings:
                rings.awake_until(time.monotonic_ns() + int(spin_s * 1e9))
            while time.perf_counter() < deadline:
                await asyncio.sleep(0)  # replies and completions run in between
                os.sched_yield()
                if rings and (messages := rings.poll(MAX_DRAIN // 2)):
                    return messages, reader.try_recv()
                if (frames := reader.try_recv()) is not None:
                    return [], frames
        return None

    async def _sleep(self) -> tuple[list[Message], list[Any] | None] | None:
        """Wait for a message; None when roused (spin again)."""
        reader, rings = self._reader, self._rings
        while not self._roused:
            if rings:
                rings.awake_until(0)  # asleep: a client rings the doorbell
                if messages := rings.poll(MAX_DRAIN // 2):
                    return messages, reader.try_recv()
                frames = await reader.recv_within(CHECK_S)
            else:
                frames = await reader.recv()
            if frames is not None:  # a doorbell, perhaps: what it rang for is in a ring by now
                return (rings.poll(MAX_DRAIN // 2) if rings else []), frames
        return None

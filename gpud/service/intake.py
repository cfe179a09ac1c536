"""Reading the daemon's socket in slices, so that the rest of the daemon always gets its turn.

A slice is what is ready, up to `MAX_DRAIN` messages. When a message is already waiting as the
next slice begins, the receive loop yields to the event loop first: otherwise a peer that sends
faster than the daemon reads would keep the socket from ever being empty, and completions, lease
expiry, health, outbox retries and other sessions' replies would wait for as long as it sent.

Leases are judged by `caught_up()`: the last time every peer's waiting messages had been read up
to that point, so that a heartbeat still unread in the socket proves nothing either way. That is
when the socket was read empty, or when one slice read a peer twice: ZeroMQ's ROUTER reads its
peers in turn, one message each, so by then every peer with a message waiting had one read.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from gpud_protocol.reader import SocketReader

MAX_DRAIN = 256  # messages taken per slice before the devices and the rest of the loop get a say

Message = tuple[bytes, list[Any]]  # (the peer's identity, the message's frames)


class Intake:
    def __init__(self, reader: SocketReader, busy_poll_us: float = 0.0) -> None:
        self._reader = reader
        self._busy_poll_s = busy_poll_us / 1e6
        self._waiting = False  # waiting on an empty socket
        self._caught_up_at = time.monotonic()

    def caught_up(self) -> float:
        """The last time (monotonic) every message that waited in the socket had been read."""
        return time.monotonic() if self._waiting else self._caught_up_at

    async def next_slice(self) -> list[Message]:
        """The next messages: waits for one, then takes what is ready, at most `MAX_DRAIN`."""
        reader = self._reader
        frames = reader.try_recv()
        if frames is None:
            frames = await self._next_message()
        else:
            await asyncio.sleep(0)  # the socket never ran dry: let the rest of the loop run first
        identity = frames[0].bytes
        messages: list[Message] = [(identity, frames[1:])]
        seen = {identity}
        caught_up = False
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

    async def _next_message(self) -> list[Any]:
        """Wait for a message; with `busy_poll_us`, poll for it first (lower latency, one busy core)."""
        reader = self._reader
        frames: list[Any] | None = None
        if self._busy_poll_s > 0:
            deadline = time.perf_counter() + self._busy_poll_s
            while frames is None and time.perf_counter() < deadline:
                await asyncio.sleep(0)  # replies and completions run in between
                frames = reader.try_recv()
        if frames is None:
            self._waiting = True  # the socket is empty for as long as this waits
            try:
                frames = await reader.recv()
            finally:
                self._waiting = False
        return frames

"""Receiving from a ZeroMQ socket inside an asyncio loop, without a future per message (needs pyzmq).

pyzmq's zmq.asyncio adds and removes the socket's file descriptor from the loop around every
receive; on a small host that costs most of a round trip. Here the descriptor is registered once.
ZeroMQ's descriptor is edge-triggered and only means "look at EVENTS", so a receiver drains the
socket with non-blocking reads, and anyone who sends on the socket calls `poke()` afterwards (a
send can consume the edge that announced an incoming message). Cancelling `recv()` loses nothing:
messages stay in the socket until a read takes them.
"""

from __future__ import annotations

import asyncio
from typing import Any

import zmq

# As plain ints: pyzmq's enums make every `get(EVENTS) & POLLIN` build flag objects (a third of a poll).
_EVENTS, _POLLIN, _NOBLOCK = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.NOBLOCK)


class SocketReader:
    def __init__(self, sock: zmq.Socket[Any]) -> None:
        self._sock = sock
        self._ready = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._fd: int = sock.fileno()
        self._loop.add_reader(self._fd, self._ready.set)

    def try_recv(self) -> list[zmq.Frame] | None:
        """One message if one is waiting, else None (asking EVENTS first: no exception to raise)."""
        if not int(self._sock.get(_EVENTS)) & _POLLIN:
            return None
        try:
            return self._sock.recv_multipart(flags=_NOBLOCK, copy=False)
        except zmq.Again:
            return None

    async def recv(self) -> list[zmq.Frame]:
        while True:
            if (frames := self.try_recv()) is not None:
                return frames
            self._ready.clear()
            if int(self._sock.get(_EVENTS)) & _POLLIN:
                continue  # arrived between the read and the clear
            await self._ready.wait()

    async def recv_within(self, timeout: float) -> list[zmq.Frame] | None:
        """A message, or None when none came within `timeout` seconds."""
        if (frames := self.try_recv()) is not None:
            return frames
        self._ready.clear()
        if int(self._sock.get(_EVENTS)) & _POLLIN:
            return self.try_recv()
        try:
            await asyncio.wait_for(self._ready.wait(), timeout)
        except TimeoutError:
            return None
        return self.try_recv()

    def poke(self) -> None:
        """Call after sending on the socket: wake the receiver if a message is waiting."""
        if int(self._sock.get(_EVENTS)) & _POLLIN:
            self._ready.set()

    def wake(self) -> None:
        """Wake a waiting `recv_within` (it returns None unless a message came)."""
        self._ready.set()

    def close(self) -> None:
        self._loop.remove_reader(self._fd)

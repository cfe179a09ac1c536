"""The client's socket: where the daemon listens, and sending batches to it.

Batches go without blocking; when the daemon does not keep up (ZeroMQ's queue is full, or the
daemon's request window is), they are held and sent in order as it confirms earlier ones.
"""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path
from typing import Any

import anyio
import zmq

import gpud_protocol as proto
from gpud_client.batch import OpQueue
from gpud_client.errors import DaemonLost, GpudError, InvalidArgument
from gpud_client.ring import ClientRing
from gpud_protocol.reader import SocketReader

HANDSHAKE_TIMEOUT_S = 10.0
SEND_QUEUE_MESSAGES = 64  # messages queued in ZeroMQ before the client holds batches itself


def default_address(system: Path = Path("/run/gpud/gpud.sock")) -> str:
    """`GPUD_ADDRESS`; else a per-user daemon's socket, $XDG_RUNTIME_DIR/gpud/gpud.sock, if it exists;
    else the system daemon's socket `system` (the systemd unit's; group gpud may connect) if it
    exists; else the per-user path (root: the system one), where `connect()` then says nothing listens."""
    if address := os.environ.get("GPUD_ADDRESS"):
        return address
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if not runtime or os.geteuid() == 0:
        return f"ipc://{system}"
    user = Path(runtime) / "gpud" / "gpud.sock"
    return f"ipc://{system if not user.exists() and system.exists() else user}"


MAX_SPIN_US = 1e6


def spin_from_environment() -> float:
    """`GPUD_SPIN_US` (microseconds a request polls for its reply before it sleeps), else 0."""
    text = os.environ.get("GPUD_SPIN_US", "")
    if not text:
        return 0.0
    try:
        spin = float(text)
    except ValueError:
        spin = -1.0
    if not 0 <= spin <= MAX_SPIN_US:
        raise InvalidArgument(f"GPUD_SPIN_US must be microseconds from 0 to {MAX_SPIN_US:.0f}, not {text!r}")
    return spin


def check_listening(address: str) -> None:
    """Fail fast (DaemonLost) when nothing listens at `address`, instead of waiting for a handshake."""
    if address.startswith("ipc://"):
        path = address[len("ipc://") :]
        if not Path(path).exists():
            raise DaemonLost(f"no gpud socket at {address}: start one with `gpud serve`")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
        except ConnectionRefusedError:
            raise DaemonLost(f"nothing listens at {address} (a stale socket file): start `gpud serve`") from None
        except PermissionError:
            raise DaemonLost(f"no permission to use {address}: join the socket's group (gpud)") from None
        except OSError:
            pass  # let ZeroMQ say what it thinks
        finally:
            probe.close()
    elif address.startswith("tcp://"):
        host, _, port = address[len("tcp://") :].rpartition(":")
        if port.isdigit():
            try:
                socket.create_connection((host.strip("[]"), int(port)), timeout=2).close()
            except ConnectionRefusedError:
                raise DaemonLost(f"nothing listens at {address}: start `gpud serve`") from None
            except OSError:
                pass


class Transport:
    """The sending half of a connection: the socket, the op queue and the batches held back."""

    def __init__(self, sock: zmq.Socket[bytes], address: str) -> None:
        self.address = address
        self._sock = sock
        self._incoming = SocketReader(sock)
        self.queue = OpQueue(proto.DEFAULT_LIMITS)
        self._send_lock = anyio.Lock()
        self._window_moved = anyio.Event()
        self.lost: GpudError | None = None
        self.ring: ClientRing | None = None  # the session's shared-memory ring, when it has one

    def send_batch(self) -> None:
        """Make a batch of what is queued and send it (or hold it while the window is full)."""
        frames = self.queue.take()
        if frames is not None:
            self._send(frames)

    def _send(self, frames: list[Any]) -> None:
        queue = self.queue
        if not queue.held and queue.window_open:
            if self._send_by_ring(frames):
                return
            try:
                self._sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
                self._incoming.poke()
                return
            except zmq.Again:  # the daemon is not keeping up: back-pressure
                pass
        queue.held.append(frames)

    async def send_held(self) -> None:
        """Send the batches held back, waiting for the daemon to confirm earlier ones when needed."""
        queue = self.queue
        async with self._send_lock:
            while queue.held:
                if self.lost is not None:
                    raise self.lost
                if not queue.window_open:
                    self._window_moved = anyio.Event()
                    with anyio.move_on_after(0.05):
                        await self._window_moved.wait()
                    continue
                try:
                    if not self._send_by_ring(queue.held[0]):
                        self._sock.send_multipart(queue.held[0], flags=zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    await anyio.sleep(0.001)  # rare: wait for the daemon to catch up
                    continue
                self._incoming.poke()
                queue.held.popleft()

    async def _all_confirmed(self) -> None:
        """Wait until the daemon has executed every batch sent (each asks a receipt or holds a request)."""
        queue = self.queue
        while queue.confirmed < queue.number and self.lost is None:
            self._window_moved = anyio.Event()
            with anyio.move_on_after(0.05):
                await self._window_moved.wait()

    def _send_by_ring(self, frames: list[Any]) -> bool:
        """Send through the ring if there is one and the message fits (ringing the doorbell if the
        daemon sleeps); False: it goes by ZeroMQ."""
        ring = self.ring
        if ring is None:
            return False
        polled = ring.send(frames)
        if polled is None:
            return False
        if not polled:
            self._send_control(proto.DOORBELL)
        return True

    def _send_control(self, message: bytes) -> None:
        with contextlib.suppress(zmq.ZMQError):
            self._sock.send(message, flags=zmq.NOBLOCK)
            self._incoming.poke()

    def close_socket(self) -> None:
        self._incoming.close()

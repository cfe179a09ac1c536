"""Requests and replies: futures resolved by sequence number by the one reader of the socket.

A cancelled await never loses another reply (futures are resolved by seq, and messages stay in the
socket until the one reader takes them). Every future resolves: with data, or with an error
(DaemonLost when the daemon stops answering or goes away, SessionLost when it ended the session).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import zmq

import gpud_protocol as proto
from gpud_client.errors import DaemonLost, GpudError, ProtocolError, SessionLost, from_code
from gpud_client.naps import Expected, nap_s
from gpud_client.traces import Trace
from gpud_client.transport import Transport
from gpud_protocol.ring import CHECK_S, RingCorrupt

NAMED_OPS = 65536  # op-library calls whose name a failure reported later can still be given

Reply = tuple[dict[str, Any], Any]  # (header, data: a frame's buffer, an assembled array, or None)


class _Parts:
    """A readback arriving in several messages, copied into one array as the parts come."""

    __slots__ = ("data", "header", "left", "offset")

    def __init__(self, header: dict[str, Any]) -> None:
        self.header = header
        self.data = np.empty(int(header["n"]), np.uint8)
        self.offset = 0
        self.left = int(header["parts"])

    def add(self, frame: Any) -> bool:
        view = np.frombuffer(frame.buffer if hasattr(frame, "buffer") else frame, np.uint8)
        self.data[self.offset : self.offset + view.size] = view
        self.offset += view.size
        self.left -= 1
        return self.left == 0


class Rpc(Transport):
    """A transport whose requests are awaited: futures by seq, the reader resolving them."""

    def __init__(self, sock: zmq.Socket[bytes], address: str, spin_us: float = 0.0) -> None:
        super().__init__(sock, address)
        self._spin_s = spin_us / 1e6
        self._futures: dict[int, asyncio.Future[Reply]] = {}
        self._parts: dict[int, _Parts] = {}
        self._unreported: GpudError | None = None  # a daemon error that arrived while nothing waited
        self._last_heard = time.monotonic()
        self._received_at = 0.0
        self.welcome: dict[str, Any] = {}
        self.redirect: proto.Redirect | None = None  # a process-per-device front's answer to hello
        self.may_redirect = True  # false at the worker a redirect led to: one redirect at most
        self.limits = proto.DEFAULT_LIMITS
        self.last_trace: Trace | None = None
        self._op_names: OrderedDict[int, str] = OrderedDict()  # seq of an op-library dispatch -> its op
        # Told of each failed op (its seq, the daemon's name for it, the error) before anyone sees the error.
        self.on_failure: Callable[[int, str, GpudError], None] | None = None

    async def request(self, seq: int, expected: Expected | None = None) -> Reply:
        """Send what is queued (the request `seq` is its last op) and wait for the reply (`expected`: how
        long this request's replies took before, and so when to spin for this one; `naps`)."""
        return await self.submit(seq, expected)

    def submit(self, seq: int, expected: Expected | None = None) -> Coroutine[Any, Any, Reply]:
        """Send what is queued (the request `seq` is its last op) now; await what this returns for the
        reply. Requests submitted before the first is awaited are in flight together."""
        if (unreported := self._unreported) is not None:
            self._unreported = None
            raise unreported
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._futures[seq] = future
        sent_at = time.perf_counter()
        self.send_batch()
        return self._reply(seq, future, sent_at, expected)

    async def _reply(self, seq: int, future: asyncio.Future[Reply], sent_at: float, expected: Expected | None) -> Reply:
        try:
            if self.queue.held:
                await self.send_held()
            if spin_s := self._spin_s:
                deadline = time.perf_counter() + spin_s
                if expected is not None and (due := expected.seconds()) > spin_s:
                    if nap := nap_s(due, spin_s, time.perf_counter() - sent_at):
                        await asyncio.wait((future,), timeout=nap)
                    deadline = max(sent_at + due, time.perf_counter()) + spin_s / 2
                self._spin_until(future, deadline)
            header, data = await future
        finally:
            self._futures.pop(seq, None)  # a cancelled await leaves no entry behind
        if expected is not None and self._spin_s:  # only a spinning session reads it
            expected.add(self._received_at - sent_at)
        if "tr" in header:
            received, executed, flushed, completed = header["tr"]
            self.last_trace = Trace(
                sent_at, received, executed, flushed, completed, self._received_at, time.perf_counter()
            )
        return header, data

    def expect(self, seq: int) -> None:
        """A request nobody awaits (a kernel the op library registers on first use): its error, if
        any, is raised by the next request, so it is not lost."""
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._futures[seq] = future

        def done(f: asyncio.Future[Reply]) -> None:
            self._futures.pop(seq, None)
            error = None if f.cancelled() else f.exception()
            lost = isinstance(error, DaemonLost | SessionLost)
            if isinstance(error, GpudError) and not lost and self._unreported is None:
                self._unreported = error

        future.add_done_callback(done)

    def name_op(self, seq: int, op: str) -> None:
        """The dispatch `seq` is the op-library call `op`: its failure says "add", not "dispatch"."""
        names = self._op_names
        names[seq] = op
        if len(names) > NAMED_OPS:
            names.popitem(last=False)

    def _spin_until(self, future: asyncio.Future[Any], deadline: float) -> None:
        """Poll the socket (and the ring, telling the daemon so) until `deadline` (perf_counter) before
        yielding to the loop (lower latency, more CPU)."""
        ring = self.ring
        if ring is not None:
            ring.listen(time.monotonic_ns() + int((deadline - time.perf_counter()) * 1e9))
        try:
            while not future.done() and time.perf_counter() < deadline:
                if ring is not None and self._drain_ring():
                    continue
                if (frames := self._incoming.try_recv()) is not None:
                    self._on_message(frames)
                else:
                    os.sched_yield()
        finally:
            if ring is not None:
                ring.listen(0)  # from now on the daemon replies by ZeroMQ, which wakes the reader
                self._drain_ring()

    # ------------------------------------------------------------------ receiving

    async def reader(self) -> None:
        while True:
            if self.ring is None:
                self._on_message(await self._incoming.recv())
                continue
            self._drain_ring()  # a reply the daemon put in the ring just as the spin ended
            if (frames := await self._incoming.recv_within(CHECK_S)) is not None:  # the ring too, this often
                self._on_message(frames)

    def _drain_ring(self) -> bool:
        """Handle what the ring holds; True if it held anything."""
        ring, got = self.ring, False
        if ring is None:
            return False
        try:
            while (frames := ring.poll()) is not None:
                got = True
                self._on_message(frames)
        except RingCorrupt as exc:
            self.ring = None  # the daemon's replies come by ZeroMQ once it has ended the session
            self._fail_all(ProtocolError(f"the daemon's ring is broken: {exc}"))
        return got

    def _on_message(self, frames: list[Any]) -> None:
        self._last_heard = time.monotonic()
        self._received_at = time.perf_counter()
        try:
            header, payload = proto.decode_server_message(frames, self.limits)
        except proto.ProtocolViolation as exc:
            self._fail_all(ProtocolError(f"undecodable message from the daemon: {exc.message}"))
            return
        kind = header["t"]
        if kind == "reply":
            self._resolve(header, payload)
        elif kind == "part":
            self._part(header, payload)
        elif kind == "receipt":
            self.queue.receipt(int(header.get("b", 0)))
            self._window_moved.set()
        elif kind == "welcome":
            self._resolve_welcome(header)
        elif kind == "redirect":
            self._resolve_redirect(header, payload)
        elif kind == "error":
            error = from_code(header.get("code", 0), str(header.get("msg", "")))
            if isinstance(error, SessionLost):
                self.mark_lost(error)
            else:
                self._fail_all(error)

    def _resolve(self, header: dict[str, Any], payload: list[Any]) -> None:
        seq = header.get("seq", -1)
        self.queue.replied(seq)
        self._window_moved.set()
        future = self._futures.get(seq)
        if header.get("ok"):
            names = self._op_names
            while names and next(iter(names)) < seq:  # answered: nothing before it failed unreported
                names.popitem(last=False)
            parts = int(header.get("parts", 1))
            if parts > 1:
                assembly = self._parts[seq] = _Parts(header)
                assembly.add(payload[0])
                return
            if future is not None and not future.done():
                future.set_result((header, payload[0].buffer if payload else None))
            return
        code, message, failed_seq, op = header["err"]
        named = self._op_names.get(failed_seq, op) if op == "dispatch" else op
        error = from_code(code, message, seq=failed_seq, op=named)
        if self.on_failure is not None:
            self.on_failure(failed_seq, op, error)
        self.queue.acks.add(failed_seq)
        self._parts.pop(seq, None)
        if future is not None and not future.done():
            future.set_exception(error)

    def _part(self, header: dict[str, Any], payload: list[Any]) -> None:
        seq = header.get("seq", -1)
        assembly = self._parts.get(seq)
        if assembly is None or not payload:
            return
        if assembly.add(payload[0]):
            del self._parts[seq]
            future = self._futures.get(seq)
            if future is not None and not future.done():
                future.set_result((assembly.header, assembly.data))

    def _resolve_welcome(self, header: dict[str, Any]) -> None:
        self.welcome = header
        known = {k: v for k, v in header.get("limits", {}).items() if k in proto.Limits.__dataclass_fields__}
        self.limits = proto.Limits(**known)
        self.queue.limits = self.limits
        self.queue.window = int(header.get("window", self.queue.window))
        if (future := self._futures.get(0)) is not None and not future.done():
            future.set_result((header, None))

    def _resolve_redirect(self, header: dict[str, Any], payload: list[Any]) -> None:
        """A front sends this hello to a device's worker: only as the answer to a first hello."""
        try:
            redirect = proto.decode_redirect(header, payload, self.limits)
        except proto.ProtocolViolation as exc:
            return self._fail_all(ProtocolError(f"a bad redirect from the daemon: {exc.message}"))
        future = self._futures.get(0)
        if not self.may_redirect or future is None or future.done():
            return self._fail_all(ProtocolError(f"an unexpected redirect from the daemon at {self.address}"))
        self.redirect = redirect
        future.set_result((header, None))

    def _fail_all(self, error: GpudError) -> None:
        futures, self._futures = self._futures, {}
        self._parts.clear()
        pending = [future for future in futures.values() if not future.done()]
        for future in pending:
            future.set_exception(error)
        if not pending and not isinstance(error, DaemonLost | SessionLost):
            self._unreported = error  # nobody waits: the next request raises it, so it is not lost

    def mark_lost(self, error: GpudError) -> None:
        if self.lost is None:
            self.lost = error
        self._window_moved.set()
        self._fail_all(error)

    async def handshake(self, timeout: float, device: int | None) -> None:
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._futures[0] = future
        name = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python"
        self._send_control(proto.encode_hello(name, os.getpid(), device))
        try:
            with anyio.fail_after(timeout):
                await future
        except TimeoutError:
            raise DaemonLost(f"no gpud answered at {self.address} within {timeout:.0f} s") from None
        finally:
            self._futures.pop(0, None)

"""A session's requests that wait on the device or report on it: readbacks (their data sent part by
part as it completes), syncs, flushes and stats. Each gets exactly one reply."""

from __future__ import annotations

import os
import time
from typing import Any

import gpud_protocol as proto
from gpud.runtime.runtime import DeviceRuntime, Wait
from gpud.session.state import SessionState
from gpud_protocol import ErrorCode
from gpud_protocol.errors import Busy, GpudError


class Requests(SessionState):
    def _readback(self, op: proto.Readback, _batch: proto.Batch) -> Wait | None:
        self._admit()
        handle = self._handle(op.handle)
        tensor = handle.tensor
        rt = self.runtimes[tensor.device]
        buffer = tensor.buffer if handle.whole else handle.span_buffer(rt)
        nbytes = buffer.nbytes
        limit = self._settings.session_reply_bytes
        if self.reply_bytes_reserved + nbytes > limit:
            raise Busy(f"readbacks of {self.reply_bytes_reserved + nbytes} bytes would wait unsent (limit {limit})")
        if rt.saturated:
            return Wait(rt.unsaturated(), lambda: self._readback(op, _batch))
        self.requests_in_flight += 1
        self.reply_bytes_reserved += nbytes
        self.touched.add(rt.index)
        try:
            reply = self._readback_reply(op.seq, nbytes, rt)
            return rt.download(buffer, reply.deliver, self)
        except BaseException:  # no reply will come to end the count (`graph_ops._reserved`)
            self._unreserve(nbytes)
            raise

    def _readback_reply(self, seq: int, nbytes: int, rt: DeviceRuntime, extra: dict[str, Any] | None = None) -> Any:
        return ReadbackReply(self, seq, nbytes, rt.parts(nbytes), rt, extra or {})

    def _sync(self, op: proto.Sync, _batch: proto.Batch) -> None:
        self._admit()
        runtimes = [self.runtimes[i] for i in sorted(self.touched)] or [self.runtimes[self.device]]
        self.requests_in_flight += 1
        remaining = len(runtimes)
        failure: list[BaseException] = []

        def one(error: BaseException | None) -> None:
            nonlocal remaining
            if error is not None:
                failure.append(error)
            remaining -= 1
            if remaining:
                return
            self.requests_in_flight -= 1
            if self.closed:
                return
            if failure:
                exc = failure[0]
                code = exc.code if isinstance(exc, GpudError) else ErrorCode.DEVICE_LOST
                self._send([proto.encode_error_reply(op.seq, code, str(exc), op.seq, "sync")])
            else:
                self._reply(op.seq)

        for rt in runtimes:
            rt.want_flush()
            rt.after(one)

    def _flush(self, op: proto.FlushOp, _batch: proto.Batch) -> None:
        self._admit()
        for index in self.touched:
            self.runtimes[index].policy.flush()
        self._reply(op.seq)

    def _stats(self, op: proto.Stats, _batch: proto.Batch) -> None:
        self._admit()
        self._reply(op.seq, stats=self.stats())

    def stats(self) -> dict[str, Any]:
        devices = [rt.stats() for rt in self.runtimes]
        return {
            "session": {
                "id": self.id,
                "device": self.shown_device(self.device),
                "handles": len(self.handles),
                "kernels": len(self.kernels),
                "private_bytes": sum(self.private_bytes),
                "private_bytes_per_device": list(self.private_bytes),
                "requests_in_flight": self.requests_in_flight,
                "reply_bytes_reserved": self.reply_bytes_reserved,
                "unacknowledged_failures": len(self.failures),
                "graphs": len(self.graphs),
                "ops_done": self.ops_done,
            },
            "residents": {"count": len(self._residents), "bytes": self._residents.nbytes},
            "published_graphs": len(self._graph_store),
            "device": devices[self.device],
            "devices": devices,
            "process": {"cpu_s": time.process_time(), "pid": os.getpid()},
        }


class ReadbackReply:
    """Sends a readback's data as it completes: the reply with part 0, then `part` messages."""

    __slots__ = ("_done", "_extra", "_parts", "_rt", "_session", "_stamp", "nbytes", "seq")

    def __init__(
        self, session: Requests, seq: int, nbytes: int, parts: int, rt: DeviceRuntime, extra: dict[str, Any]
    ) -> None:
        self._session = session
        self._extra = extra
        self.seq = seq
        self.nbytes = nbytes
        self._parts = parts
        self._rt = rt
        self._done = False
        self._stamp = (session._received_at, time.perf_counter()) if session._settings.trace else None

    def deliver(self, part: int, data: bytes | memoryview | None, error: BaseException | None) -> None:
        session = self._session
        session.reply_bytes_reserved -= min(self._rt.part_bytes, max(0, self.nbytes - part * self._rt.part_bytes))
        if self._done:
            return
        if error is not None or data is None:
            self._done = True
            session.requests_in_flight -= 1
            if not session.closed:
                code = error.code if isinstance(error, GpudError) else ErrorCode.INTERNAL
                session._send([proto.encode_error_reply(self.seq, code, str(error), self.seq, "readback")])
            return
        if part == self._parts - 1:
            self._done = True
            session.requests_in_flight -= 1
        if session.closed:
            return
        if part == 0:
            fields: dict[str, Any] = {"n": self.nbytes, "parts": self._parts, **self._extra}
            if self._stamp is not None:
                fields["tr"] = [*self._stamp, self._rt.policy.flushed_at, time.perf_counter()]
            send = session._send if self._parts == 1 else session.send_in_order
            send([proto.encode_reply(self.seq, **fields), data])
        else:
            session.send_in_order([proto.encode_part(self.seq, part), data])

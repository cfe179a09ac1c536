"""A session's uploads and copies, in op order (a copy between devices parks the session until it
completed, so its later ops see it)."""

from __future__ import annotations

import gpud_protocol as proto
from gpud.backends.base import Buffer
from gpud.runtime.runtime import Wait
from gpud.session.state import SessionState
from gpud_protocol.errors import InvalidArgument


class Transfers(SessionState):
    def _upload(self, op: proto.Upload, batch: proto.Batch) -> Wait | None:
        handle = self._writable(op.handle)
        tensor = handle.tensor
        rt = self.runtimes[tensor.device]
        buffer = handle.dense_buffer(rt)
        if op.nbytes != buffer.nbytes:
            raise InvalidArgument(f"upload of {op.nbytes} bytes into {handle.describe()}, of {buffer.nbytes}")
        if rt.saturated:
            return Wait(rt.unsaturated(), lambda: self._upload(op, batch))
        frame = batch.frames[op.frame]
        data = frame.buffer if hasattr(frame, "buffer") else memoryview(frame)
        self.touched.add(rt.index)
        return rt.upload(buffer, data.cast("B") if data.format != "B" else data, self)

    def _copy(self, op: proto.Copy, batch: proto.Batch) -> Wait | None:
        src_handle, dst_handle = self._handle(op.src), self._writable(op.dst)
        src, dst = src_handle.tensor, dst_handle.tensor
        if src.dtype != dst.dtype or src_handle.shape != dst_handle.shape:
            raise InvalidArgument(f"copy between {src_handle.describe()} and {dst_handle.describe()}")
        source, target = self.runtimes[src.device], self.runtimes[dst.device]
        src_buffer, dst_buffer = src_handle.dense_buffer(source), dst_handle.dense_buffer(target)
        if src.device != dst.device:
            return self._copy_across(src_buffer, dst_buffer)
        if source.saturated:
            return Wait(source.unsaturated(), lambda: self._copy(op, batch))
        self.touched.add(source.index)
        source.copy(src_buffer, dst_buffer, self)
        return None

    def _copy_across(self, src: Buffer, dst: Buffer) -> Wait | None:
        """Between devices: the session waits for the copy, so its later ops (reads of `dst`, writes
        of `src`) are encoded after it."""
        source, target = self.runtimes[src.device], self.runtimes[dst.device]
        self.touched.update((source.index, target.index))
        return source.copy_to(src, target, dst, self)

"""One connected client: its handles, kernels, quota and sticky error; executes its ops in order.

Errors: an op that fails is reported against its sequence number. The first failure becomes the
session's sticky error: every later request (readback, sync, ...) fails with it until the client
acknowledges it (the `ack` field of a batch), so no error is ever silently dropped.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import gpud_protocol as proto
from gpud.backends.base import Arg, Backend, Kernel, Prepared
from gpud.config import Config
from gpud.resident import Handle, ResidentStore, Tensor
from gpud.scheduler import Scheduler
from gpud_protocol import ArgKind, ErrorCode
from gpud_protocol.errors import Busy, GpudError, InvalidArgument, NotFound, OutOfMemory, PermissionDenied

log = logging.getLogger(__name__)

Send = Callable[[list[Any]], None]
PREPARED_DISPATCHES = 4096  # distinct dispatches a session keeps checked and packed


class Failure(NamedTuple):
    seq: int
    code: ErrorCode
    message: str
    op: str


class Session:
    def __init__(
        self,
        session_id: str,
        client: str,
        send: Send,
        scheduler: Scheduler,
        residents: ResidentStore,
        config: Config,
    ) -> None:
        self.id = session_id
        self.client = client
        self._send = send
        self._scheduler = scheduler
        self._backend: Backend = scheduler.backend
        self._residents = residents
        self._config = config
        self.handles: dict[int, Handle] = {}
        self.kernels: dict[int, Kernel] = {}
        self.error: Failure | None = None
        self.private_bytes = 0
        self.requests_in_flight = 0
        self.last_seen = time.monotonic()
        self.closed = False
        self.ops_done = 0
        self._received_at = 0.0
        self._prepared: dict[tuple[Any, ...], Prepared] = {}
        self.dispatch_memo: proto.DispatchMemo = {}  # validated dispatch ops, for the decoder

    # ------------------------------------------------------------------ batches

    async def run_batch(self, batch: proto.Batch, received_at: float = 0.0) -> None:
        self._received_at = received_at
        if batch.ack is not None and self.error is not None and batch.ack >= self.error.seq:
            self.error = None
        dispatch_type = proto.Dispatch
        for op in batch.ops:
            if self.closed:
                return
            if isinstance(op, proto.OpError):
                self._fail(op.seq, op.code, op.message, op.op, request=True)
                continue
            try:
                if type(op) is dispatch_type:  # the hot path, without a coroutine per op
                    self._dispatch(op)
                else:
                    await self._execute(op, batch.frames)
            except GpudError as exc:
                self._fail(op.seq, exc.code, str(exc), _opname(op), request=_is_request(op))
        self.ops_done += len(batch.ops)

    async def _execute(self, op: proto.Op, frames: list[Any]) -> None:
        """Every op but a dispatch (which `run_batch` runs itself)."""
        match op:
            case proto.Alloc():
                self._alloc(op)
            case proto.Upload():
                handle = self._writable(op.handle)
                if op.nbytes != handle.tensor.nbytes:
                    raise InvalidArgument(f"upload of {op.nbytes} bytes into a tensor of {handle.tensor.nbytes}")
                frame = frames[op.frame]
                await self._backend.upload(
                    handle.tensor.buffer, frame.buffer if hasattr(frame, "buffer") else memoryview(frame)
                )
            case proto.Readback():
                await self._readback(op)
            case proto.Free():
                self._free(op.handle)
            case proto.RegisterKernel():
                self._register_kernel(op)
            case proto.Sync():
                self._request(op.seq)
                self._scheduler.want_flush()
                self._backend.after(lambda err: self._reply_when_done(op.seq, err))
            case proto.FlushOp():
                self._check_sticky()
                self._scheduler.flush()
                self._reply(op.seq)
            case proto.Copy():
                src = self._handle(op.src).tensor
                dst = self._writable(op.dst).tensor
                if src.dtype != dst.dtype or src.shape != dst.shape:
                    raise InvalidArgument(f"copy between {src.dtype}{list(src.shape)} and {dst.dtype}{list(dst.shape)}")
                self._backend.copy(src.buffer, dst.buffer)
            case proto.Stats():
                self._reply(op.seq, stats=self.stats())
            case proto.Publish():
                handle = self._handle(op.handle)
                if not handle.writable and op.mode == "rw":
                    raise PermissionDenied("a read-only tensor cannot be republished read-write")
                self._residents.publish(handle.tensor, op.name, op.mode, by=self.id)
            case proto.Open():
                self._check_sticky()
                self._new_handle(op.handle)
                tensor = self._residents.open(op.name)
                self.handles[op.handle] = Handle(tensor, writable=tensor.mode == "rw")
                self._reply(op.seq, dtype=tensor.dtype, shape=list(tensor.shape), mode=tensor.mode)
            case proto.Unpublish():
                self._residents.unpublish(op.name, by=self.id)

    # ------------------------------------------------------------------ op handlers

    def _dispatch(self, op: proto.Dispatch) -> None:
        # Steps repeat: the same kernel, grid and arguments come again and again. What was checked
        # and packed is kept per session (bounded) until a handle goes away.
        key = (op.kernel, op.grid, op.args, op.writes)
        prepared = self._prepared.get(key)
        if prepared is None:
            prepared = self._prepare(op)
            if len(self._prepared) >= PREPARED_DISPATCHES:
                self._prepared.clear()
            self._prepared[key] = prepared
        self._backend.dispatch_prepared(prepared)
        self._scheduler.dispatched()

    def _prepare(self, op: proto.Dispatch) -> Prepared:
        kernel = self.kernels.get(op.kernel)
        if kernel is None:
            raise NotFound(f"unknown kernel handle {op.kernel}")
        handles = self.handles
        args: list[Arg] = []
        read_only: list[tuple[int, Handle]] = []  # (tensor position, handle) of read-only tensors
        position = 0
        for kind, value in op.args:
            if kind == ArgKind.TENSOR:
                handle = handles.get(value)  # type: ignore[arg-type]
                if handle is None:
                    raise NotFound(f"unknown tensor handle {value}")
                if not handle.writable:
                    read_only.append((position, handle))
                position += 1
                args.append(handle.tensor.buffer)
            else:
                args.append((kind, value))  # type: ignore[arg-type]
        if read_only:
            self._check_writes(op, kernel, read_only)
        return self._backend.prepare(kernel, op.grid, args)

    def _check_writes(self, op: proto.Dispatch, kernel: Kernel, read_only: list[tuple[int, Handle]]) -> None:
        # A dispatch may declare more written arguments than the kernel's, never fewer: what the
        # daemon knows of the kernel (WGSL access modes, CUDA const, a declaration at registration)
        # cannot be narrowed per dispatch.
        for position, handle in read_only:
            if kernel.writes is None or position in kernel.writes or position in (op.writes or ()):
                raise PermissionDenied(
                    f"tensor argument {position} is read-only resident {handle.tensor.name!r} and the "
                    "kernel writes it (declare writes=[...] when registering a kernel that only reads it)"
                )

    def _alloc(self, op: proto.Alloc) -> None:
        self._new_handle(op.handle)
        nbytes = op.nbytes
        quota = self._config.session_memory_bytes
        if self.private_bytes + nbytes > quota:
            raise OutOfMemory(
                f"session quota of {quota} bytes exceeded ({self.private_bytes} in use, {nbytes} requested)"
            )
        buffer = self._backend.alloc(nbytes)
        self.private_bytes += nbytes
        self.handles[op.handle] = Handle(Tensor(buffer, op.dtype, op.shape, self.id), writable=True)

    async def _readback(self, op: proto.Readback) -> None:
        tensor = self._handle(op.handle).tensor
        self._request(op.seq)
        future = await self._backend.download(tensor.buffer)
        self._scheduler.want_flush()
        trace = (self._received_at, time.perf_counter()) if self._config.trace else None
        future.add_done_callback(lambda f: self._reply_data(op.seq, f, trace))

    def _free(self, handle_id: int) -> None:
        self._prepared.clear()  # they may name this handle
        handle = self.handles.pop(handle_id, None)
        if handle is None:
            raise NotFound(f"unknown tensor handle {handle_id}")
        self._uncharge(handle.tensor)
        self._residents.drop(handle.tensor)

    def _uncharge(self, tensor: Tensor) -> None:
        if tensor.charged and tensor.owner == self.id:
            tensor.charged = False
            self.private_bytes -= tensor.nbytes

    def _register_kernel(self, op: proto.RegisterKernel) -> None:
        if op.handle in self.kernels:
            raise InvalidArgument(f"kernel handle {op.handle} is in use")
        if len(self.kernels) >= self._config.session_max_kernels:
            raise OutOfMemory(f"more than {self._config.session_max_kernels} kernels in this session")
        self._request(op.seq)
        try:
            kernel = self._backend.kernel(op.source, op.entry, op.options)
        finally:
            self.requests_in_flight -= 1
        self.kernels[op.handle] = kernel
        writes = None if kernel.writes is None else sorted(kernel.writes)
        self._reply(op.seq, writes=writes)

    # ------------------------------------------------------------------ helpers

    def _handle(self, handle_id: int) -> Handle:
        handle = self.handles.get(handle_id)
        if handle is None:
            raise NotFound(f"unknown tensor handle {handle_id}")
        return handle

    def _writable(self, handle_id: int) -> Handle:
        handle = self._handle(handle_id)
        if not handle.writable:
            raise PermissionDenied(f"resident tensor {handle.tensor.name!r} is read-only")
        return handle

    def _new_handle(self, handle_id: int) -> None:
        if handle_id in self.handles:
            raise InvalidArgument(f"tensor handle {handle_id} is in use")
        if len(self.handles) >= self._config.session_max_handles:
            raise OutOfMemory(f"more than {self._config.session_max_handles} open tensor handles in this session")

    def _request(self, seq: int) -> None:
        """Admit one more awaited request, or refuse it (back-pressure)."""
        self._check_sticky()
        if self.requests_in_flight >= self._config.session_max_requests:
            raise Busy(f"more than {self._config.session_max_requests} requests in flight")
        self.requests_in_flight += 1

    def _check_sticky(self) -> None:
        """A request fails with the session's unacknowledged error, so the client hears of it."""
        if self.error is not None:
            raise _Sticky(self.error)

    def _fail(self, seq: int, code: ErrorCode, message: str, op: str, *, request: bool) -> None:
        if code == ErrorCode.INTERNAL:
            log.error("session %s op %s (%s): %s", self.id, seq, op, message)
        if self.error is None:
            self.error = Failure(seq, code, message, op)
        if request:  # a request always gets its answer: the sticky error
            err = self.error
            self._send([proto.encode_error_reply(seq, err.code, err.message, err.seq, err.op)])

    def _reply(self, seq: int, **fields: Any) -> None:
        self._send([proto.encode_reply(seq, **fields)])

    def _reply_when_done(self, seq: int, error: BaseException | None) -> None:
        self.requests_in_flight -= 1
        if self.closed:
            return
        if error is not None:
            self._fail(seq, ErrorCode.DEVICE_LOST, str(error), "sync", request=True)
        else:
            self._reply(seq)

    def _reply_data(self, seq: int, future: asyncio.Future[bytes], trace: tuple[float, float] | None) -> None:
        self.requests_in_flight -= 1
        if self.closed:
            return
        if (exc := future.exception()) is not None:
            code = exc.code if isinstance(exc, GpudError) else ErrorCode.INTERNAL
            self._fail(seq, code, str(exc), "readback", request=True)
        else:
            data = future.result()
            if trace is None:
                self._send([proto.encode_reply(seq, n=len(data)), data])
            else:  # perf_counter is CLOCK_MONOTONIC: comparable with the client's on the same host
                stamps = [*trace, self._scheduler.flushed_at, time.perf_counter()]
                self._send([proto.encode_reply(seq, n=len(data), tr=stamps), data])

    def stats(self) -> dict[str, Any]:
        return {
            "session": {
                "id": self.id,
                "handles": len(self.handles),
                "kernels": len(self.kernels),
                "private_bytes": self.private_bytes,
                "requests_in_flight": self.requests_in_flight,
                "ops_done": self.ops_done,
            },
            "residents": {"count": len(self._residents), "bytes": self._residents.nbytes},
            "device": self._backend.stats(),
            "process": {"cpu_s": time.process_time(), "pid": os.getpid()},
        }

    def close(self) -> None:
        """Free private resources; resident tensors stay with their remaining references."""
        self.closed = True
        for handle_id in list(self.handles):
            self._free(handle_id)
        self.kernels.clear()


class _Sticky(GpudError):
    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.message)
        self.failure = failure
        self.code = failure.code


# Failed ops are named as the decoder names them (Opcode names), whichever side finds the error.
_OP_NAMES: dict[type[Any], str] = {proto.RegisterKernel: "kernel", proto.FlushOp: "flush"}


def _opname(op: proto.Op) -> str:
    return _OP_NAMES.get(type(op)) or type(op).__name__.lower()


def _is_request(op: proto.Op) -> bool:
    return isinstance(op, proto.Readback | proto.RegisterKernel | proto.Sync | proto.Stats | proto.Open | proto.FlushOp)

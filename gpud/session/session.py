"""One connected client: its handles, kernels, quota and unacknowledged failures; runs its ops in order.

Ops run synchronously on the loop thread. An op that must wait (a compile, a full staging pool, a
device with too many submissions in flight) parks the session: its remaining ops, and later
batches, wait in a bounded backlog while a task awaits the condition and resumes the op. Other
sessions never wait for it.

Every op gets exactly one outcome: a request gets its reply (data or an error); any other op that
fails is kept in `failures` and answered on the session's next requests until acknowledged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import time
from collections import Counter, deque
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

import gpud_protocol as proto
from gpud.backends.base import Buffer
from gpud.ops import options_block as ops_block
from gpud.ops import source as ops_source
from gpud.runtime.runtime import DeviceRuntime, Wait
from gpud.session import graph_ops, resident_ops
from gpud.session.failures import Failure, Failures
from gpud.session.graphs import Family, GraphStore
from gpud.session.kernels import KernelRef, KernelTable
from gpud.session.prepared import PreparedDispatches
from gpud.session.residents import ResidentStore
from gpud.session.tensors import Handle, Tensor, bind_views, view_of
from gpud_protocol import ErrorCode, TensorView
from gpud_protocol.errors import (
    Busy,
    GpudError,
    InternalError,
    InvalidArgument,
    NotFound,
    OutOfMemory,
    PermissionDenied,
)
from gpud_protocol.ops import PREFIX as OPS_PREFIX
from gpud_protocol.ops import TensorInfo
from gpud_protocol.ops import spec_of as ops_spec_of

log = logging.getLogger(__name__)

Send = Callable[[list[Any]], None]


class Settings(Protocol):
    @property
    def limits(self) -> proto.Limits: ...  # the protocol's bounds, as the welcome told the client

    @property
    def session_memory_bytes(self) -> int: ...

    @property
    def session_max_requests(self) -> int: ...

    @property
    def session_max_handles(self) -> int: ...

    @property
    def session_max_kernels(self) -> int: ...

    @property
    def session_max_failures(self) -> int: ...

    @property
    def session_window(self) -> int: ...

    @property
    def session_reply_bytes(self) -> int: ...

    @property
    def session_max_graphs(self) -> int: ...

    @property
    def graph_instances(self) -> int: ...

    @property
    def trace(self) -> bool: ...


class Daemon(Protocol):
    """What a session needs from the daemon around it."""

    runtimes: list[DeviceRuntime]
    residents: ResidentStore
    graph_store: GraphStore

    def spawn(self, coroutine: Coroutine[Any, Any, None]) -> None: ...

    def after_work(self) -> None: ...


class _Unacknowledged(GpudError):
    """A request answered with an earlier failure the client has not acknowledged."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.text())
        self.failure = failure


class Session:
    def __init__(
        self, session_id: str, client: str, send: Send, daemon: Daemon, settings: Settings, device: int
    ) -> None:
        self.id = session_id
        self.client = client
        self._send = send
        self._daemon = daemon
        self.runtimes = daemon.runtimes
        self._residents = daemon.residents
        self._graph_store = daemon.graph_store
        self._settings = settings
        self.device = device  # the default device
        self.beat_key = ""  # the secret a heartbeat from another socket must carry
        self.handles: dict[int, Handle] = {}
        self._held: Counter[Tensor] = Counter()  # handles of this session per tensor
        self._charged: set[Tensor] = set()  # tensors counted in this session's quota
        self.private_bytes = [0] * len(self.runtimes)  # per device
        self.kernels = KernelTable(settings.session_max_kernels)
        self.graphs: dict[int, Family] = {}  # graph handles: families built or opened by this session
        self._graph_names: dict[str, int] = {}  # names of the families it built
        self.failures = Failures(settings.session_max_failures)
        self.requests_in_flight = 0
        self.reply_bytes_reserved = 0
        self._backlog: deque[tuple[proto.Batch, int, float]] = deque()
        self._parked = False
        self._prepared = PreparedDispatches()
        self.dispatch_memo: proto.DispatchMemo = proto.new_dispatch_memo()  # validated dispatch ops, for the decoder
        self.touched: set[int] = set()  # devices this session has encoded work on
        self.last_seen = time.monotonic()
        self.closed = False
        self.ops_done = 0
        self._received_at = 0.0

    # ------------------------------------------------------------------ batches

    def receive(self, batch: proto.Batch, received_at: float = 0.0) -> None:
        self.failures.acknowledge(batch.ack)
        if self._parked or self._backlog:
            if len(self._backlog) >= self._settings.session_window:
                self._refuse(batch, Busy(f"more than {self._settings.session_window} batches wait unexecuted"))
            else:
                self._backlog.append((batch, 0, received_at))
            return
        self._run(batch, 0, received_at)

    def _run(self, batch: proto.Batch, start: int, received_at: float) -> None:
        self._received_at = received_at
        ops = batch.ops
        dispatch, handlers = proto.Dispatch, _HANDLERS
        for index in range(start, len(ops)):
            if self.closed:
                return
            op = ops[index]
            try:
                if type(op) is dispatch:  # the hot path, without a lookup
                    wait = self._dispatch(op)
                elif type(op) is proto.OpError:
                    self._report(op.seq, op.op, _is_request_name(op.op), ErrorCode(op.code), op.message)
                    continue
                else:
                    wait = handlers[type(op)](self, op, batch)
            except Exception as exc:
                self._failed(op, exc)
                continue
            if wait is not None:
                self._park(batch, index, wait)
                return
        self.ops_done += len(ops)
        if batch.receipt:
            self._send([proto.encode_receipt(batch.number)])

    def _park(self, batch: proto.Batch, index: int, wait: Wait) -> None:
        self._parked = True
        self._daemon.spawn(self._resume(batch, index, wait))

    async def _resume(self, batch: proto.Batch, index: int, wait: Wait | None) -> None:
        op = batch.ops[index]
        while wait is not None:
            # What the op encoded before it waited (a copy between devices, a part of an upload) must
            # be submitted for the wait to end: nothing else may drain for a while.
            self._daemon.after_work()
            with contextlib.suppress(Exception):  # the resume sees the outcome (a compile error...)
                await wait.ready
            if self.closed:
                return
            try:
                wait = wait.resume()
            except Exception as exc:
                self._failed(op, exc)
                wait = None
        self._parked = False
        self._run(batch, index + 1, self._received_at)
        while not self._parked and self._backlog and not self.closed:
            next_batch, start, received_at = self._backlog.popleft()
            self._run(next_batch, start, received_at)
        self._daemon.after_work()

    def _refuse(self, batch: proto.Batch, error: GpudError) -> None:
        for op in batch.ops:
            self._failed(op, error)
        if batch.receipt:
            self._send([proto.encode_receipt(batch.number)])

    # ------------------------------------------------------------------ outcomes

    def _failed(self, op: proto.Op | proto.OpError, exc: BaseException) -> None:
        if isinstance(op, proto.OpError):
            self._report(op.seq, op.op, _is_request_name(op.op), ErrorCode(op.code), op.message)
            return
        spec = proto.OPS[_OPCODE_OF[type(op)]]
        if isinstance(exc, _Unacknowledged):  # a request answered with an earlier failure
            f = exc.failure
            self._send([proto.encode_error_reply(op.seq, f.code, f.text(), f.seq, f.op)])
            return
        if not isinstance(exc, GpudError):
            log.error("session %s: op #%s (%s) failed inside gpud", self.id, op.seq, spec.name, exc_info=exc)
            exc = InternalError(f"{type(exc).__name__}: {exc}")
        self._report(op.seq, spec.name, spec.request, exc.code, exc.message)

    def _report(self, seq: int, opname: str, request: bool, code: ErrorCode, message: str) -> None:
        if request:  # a request gets its own answer
            self._send([proto.encode_error_reply(seq, code, message, seq, opname)])
        else:
            self.failures.add(Failure(seq, code, message, opname))

    def work_lost(self, error: GpudError) -> None:
        """A submission holding this session's work was refused (the daemon missed an invalid op)."""
        if not self.closed:
            self.failures.add(Failure(0, error.code, error.message, "submission"))

    def _admit(self) -> None:
        """A request may run: nothing unacknowledged failed before it, and the window has room."""
        if (first := self.failures.first()) is not None:
            raise _Unacknowledged(first)
        if self.requests_in_flight >= self._settings.session_max_requests:
            raise Busy(f"more than {self._settings.session_max_requests} requests in flight")

    def _reply(self, seq: int, **fields: Any) -> None:
        self._send([proto.encode_reply(seq, **fields)])

    # ------------------------------------------------------------------ tensors

    def _alloc(self, op: proto.Alloc, _batch: proto.Batch) -> None:
        self._new_handle(op.handle)
        rt = self._runtime(op.device)
        nbytes = op.nbytes
        quota = self._settings.session_memory_bytes
        used = self.private_bytes[op.device]
        if used + nbytes > quota:
            raise OutOfMemory(
                f"session quota of {quota} bytes on device {op.device} exceeded ({used} in use, {nbytes} requested)"
            )
        tensor = Tensor(rt.alloc(nbytes), op.dtype, op.shape, charged_to=self)
        self.private_bytes[op.device] += nbytes
        self._charged.add(tensor)
        self._hold(op.handle, Handle(tensor, True, op.shape))

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

    def _free(self, op: proto.Free, _batch: proto.Batch) -> None:
        self._free_handle(op.handle)

    def _free_handle(self, handle_id: int) -> None:
        handle = self.handles.pop(handle_id, None)
        if handle is None:
            raise NotFound(f"unknown tensor handle {handle_id}")
        self._prepared.forget(handle_id)
        tensor = handle.tensor
        self._held[tensor] -= 1
        if not self._held[tensor]:
            del self._held[tensor]
        self.uncharge_if_unheld(tensor)
        self._residents.drop(tensor)

    def uncharge_if_unheld(self, tensor: Tensor) -> None:
        """Stop counting `tensor` in the quota once this session neither holds nor publishes it."""
        if tensor not in self._charged or tensor in self._held:
            return
        if tensor.name is not None and tensor.publisher == self.id:
            return
        self._uncharge(tensor)

    def _uncharge(self, tensor: Tensor) -> None:
        self._charged.discard(tensor)
        tensor.charged_to = None
        self.private_bytes[tensor.device] -= tensor.nbytes

    def _reshape(self, op: proto.Reshape, _batch: proto.Batch) -> None:
        self._new_handle(op.handle)
        src = self._handle(op.src)
        if math.prod(op.shape) != math.prod(src.shape):
            raise InvalidArgument(f"cannot reshape {src.describe()} to {list(op.shape)}: the element counts differ")
        src.tensor.refs += 1
        self._hold(op.handle, Handle(src.tensor, src.writable, op.shape))

    def _publish(self, op: proto.Publish, _batch: proto.Batch) -> None:
        handle = self._handle(op.handle)
        if handle.shape != handle.tensor.shape:
            raise InvalidArgument(f"publish the tensor as allocated, {handle.tensor.describe()}, not a reshaped handle")
        if not handle.writable and op.mode == "rw":
            raise PermissionDenied("a read-only tensor cannot be republished read-write")
        self._residents.publish(handle.tensor, op.name, op.mode, by=self.id)

    def _open(self, op: proto.Open, _batch: proto.Batch) -> None:
        self._admit()
        self._new_handle(op.handle)
        tensor = self._residents.open(op.name)
        self._hold(op.handle, Handle(tensor, tensor.mode == "rw", tensor.shape))
        self._reply(op.seq, dtype=tensor.dtype, shape=list(tensor.shape), mode=tensor.mode, device=tensor.device)

    def _unpublish(self, op: proto.Unpublish, _batch: proto.Batch) -> None:
        self._residents.unpublish(op.name, by=self.id)

    def _hold(self, handle_id: int, handle: Handle) -> None:
        self.handles[handle_id] = handle
        self._held[handle.tensor] += 1

    def _handle(self, ref: int | TensorView) -> Handle:
        """The tensor a handle names, or a view of one names (seen with the view's shape)."""
        if isinstance(ref, TensorView):
            return view_of(self._handle(ref.handle), ref)
        handle = self.handles.get(ref)
        if handle is None:
            raise NotFound(f"unknown tensor handle {ref}")
        return handle

    def _writable(self, ref: int | TensorView) -> Handle:
        handle = self._handle(ref)
        if not handle.writable:
            raise PermissionDenied(f"resident tensor {handle.tensor.name!r} is read-only")
        return handle

    def _new_handle(self, handle_id: int) -> None:
        if handle_id in self.handles or handle_id in self.kernels or handle_id in self.graphs:
            raise InvalidArgument(f"handle {handle_id} is in use")
        if len(self.handles) >= self._settings.session_max_handles:
            raise OutOfMemory(f"more than {self._settings.session_max_handles} open tensor handles in this session")

    def _runtime(self, device: int) -> DeviceRuntime:
        if not 0 <= device < len(self.runtimes):
            raise InvalidArgument(f"no device {device}: this daemon has {len(self.runtimes)}")
        return self.runtimes[device]

    # ------------------------------------------------------------------ kernels and dispatches

    def _kernel(self, op: proto.RegisterKernel, _batch: proto.Batch) -> Wait | None:
        self._admit()
        existing = self.kernels.find(op.source, op.entry, op.options)
        if existing is not None and existing.handle != op.handle and op.handle not in self.kernels:
            self._new_handle(op.handle)  # the client uses the handle it chose: make it name the same kernel
            self.kernels.alias(op.handle, existing)
        if existing is not None:
            self._reply_kernel(op.seq, existing)
            return None
        if op.handle in self.handles or op.handle in self.kernels or op.handle in self.graphs:
            raise InvalidArgument(f"handle {op.handle} is in use")
        self.kernels.check_room()
        rt = self.runtimes[self.device]
        source, options, builtin = op.source, op.options, ops_spec_of(op.source)
        if builtin is not None:
            if op.entry != builtin.name:
                raise InvalidArgument(f"the built-in kernel {builtin.name} has entry point {builtin.name!r}")
            try:
                source = ops_source(builtin.family, rt.device.kind)
            except LookupError as exc:
                raise InvalidArgument(str(exc)) from None
            options = proto.KernelOptions(ops_block(builtin, rt.device.kind))
        elif op.source.startswith(OPS_PREFIX):
            raise NotFound(f"no built-in kernel {op.source[len(OPS_PREFIX) :]!r}")
        got = rt.program(source, op.entry, options)
        if isinstance(got, asyncio.Future):
            future = got
            return Wait(future, lambda: self._kernel_compiled(op, rt.index, future.result(), source, options, builtin))
        self._kernel_compiled(op, rt.index, got, source, options, builtin)
        return None

    def _kernel_compiled(
        self,
        op: proto.RegisterKernel,
        device: int,
        program: Any,
        source: str,
        options: proto.KernelOptions,
        builtin: Any,
    ) -> Wait | None:
        key = (op.source, op.entry, op.options)
        kernel = self.kernels.add(op.handle, key, source, op.entry, options, device, program, builtin)
        self._reply_kernel(op.seq, kernel)
        return None

    def _reply_kernel(self, seq: int, kernel: KernelRef) -> None:
        program = kernel.first
        written = kernel.writes(program)
        writes = None if written is None else sorted(written)
        self._reply(seq, handle=kernel.handle, writes=writes, unchecked=list(program.unchecked))

    def _dispatch(self, op: proto.Dispatch) -> Wait | None:
        # Steps repeat: what was checked and packed is kept per session (bounded) until a handle goes.
        key = op[1:]
        entry = self._prepared.get(key)
        if entry is None:
            prepared = self._prepare(op)
            if type(prepared) is Wait:
                return prepared
            entry = prepared
        prepared, rt, _handles = entry
        if rt.saturated:
            return Wait(rt.unsaturated(), lambda: self._dispatch(op))
        rt.dispatch(prepared, self)
        return None

    def _prepare(self, op: proto.Dispatch) -> Any:
        kernel = self.kernels.get(op.kernel)
        if kernel is None:
            raise NotFound(f"unknown kernel handle {op.kernel}")
        handles = self.handles
        args: list[Any] = []
        tensor_handles: list[int] = []
        read_only: list[tuple[int, Handle]] = []
        scalars: list[str] = []
        infos: list[TensorInfo] = []
        values: list[int | float] = []
        device = -1
        for kind, value in op.args:
            if kind == proto.ArgKind.TENSOR:
                handle_id = value.handle if isinstance(value, TensorView) else int(value)
                found = handles.get(handle_id)
                if found is None:
                    raise NotFound(f"unknown tensor handle {handle_id}")
                handle = view_of(found, value) if isinstance(value, TensorView) else found
                if device == -1:
                    device = handle.tensor.device
                elif handle.tensor.device != device:
                    raise InvalidArgument(
                        f"tensor argument {len(tensor_handles)} is on device {handle.tensor.device}, "
                        f"the ones before it on device {device}: copy it first (gpu.copy)"
                    )
                if not handle.writable:
                    read_only.append((len(tensor_handles), handle))
                tensor_handles.append(handle_id)
                args.append(handle)  # its buffer once the checks passed (`bind_views`)
                infos.append(handle.info)
            else:
                scalars.append(proto.SCALAR_NAMES[proto.ArgKind(kind)])
                args.append((kind, value))
                values.append(value)  # type: ignore[arg-type]  # a scalar: the codec made only tensors views
        device = self.device if device == -1 else device
        rt = self.runtimes[device]
        program = kernel.programs.get(device)
        if program is None:
            got = rt.program(kernel.source, kernel.entry, kernel.options)
            if isinstance(got, asyncio.Future):
                future = got

                def compiled() -> Wait | None:
                    kernel.programs[device] = future.result()
                    return self._dispatch(op)

                return Wait(future, compiled)
            program = kernel.programs[device] = got
        kernel.check_arguments(program, len(tensor_handles), tuple(scalars))
        kernel.check_op(infos, values)
        written = kernel.writes(program)
        for position, handle in read_only:
            if written is None or position in written or position in (op.writes or ()):
                raise PermissionDenied(kernel.writes_read_only(position, handle.tensor.name, values))
        bind_views(args, kernel, rt)
        prepared = rt.prepare(program, op.grid, args)
        handle_ids = tuple(tensor_handles)
        self._prepared.add(op[1:], prepared, rt, handle_ids)
        self.touched.add(device)
        return (prepared, rt, handle_ids)

    # ------------------------------------------------------------------ requests

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
        reply = self._readback_reply(op.seq, nbytes, rt)
        return rt.download(buffer, reply.deliver, self)

    def _readback_reply(self, seq: int, nbytes: int, rt: DeviceRuntime, extra: dict[str, Any] | None = None) -> Any:
        return _ReadbackReply(self, seq, nbytes, rt.parts(nbytes), rt, extra or {})

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
                "device": self.device,
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

    # ------------------------------------------------------------------ end

    def close(self) -> None:
        """Free private resources; resident tensors stay with their remaining references."""
        self.closed = True
        self._backlog.clear()
        for family in list(self.graphs.values()):
            graph_ops.drop(self, family)
        self.graphs.clear()
        for handle_id in list(self.handles):
            self._free_handle(handle_id)
        for tensor in list(self._charged):
            self._uncharge(tensor)
        self.kernels.clear()
        self._prepared.clear()


class _ReadbackReply:
    """Sends a readback's data as it completes: the reply with part 0, then `part` messages."""

    __slots__ = ("_done", "_extra", "_parts", "_rt", "_session", "_stamp", "nbytes", "seq")

    def __init__(
        self, session: Session, seq: int, nbytes: int, parts: int, rt: DeviceRuntime, extra: dict[str, Any]
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
            session._send([proto.encode_reply(self.seq, **fields), data])
        else:
            session._send([proto.encode_part(self.seq, part), data])


_OPCODE_OF = {spec.type: code for code, spec in proto.OPS.items()}
_REQUEST_NAMES = frozenset(spec.name for spec in proto.OPS.values() if spec.request)


def _is_request_name(name: str) -> bool:
    return name in _REQUEST_NAMES


_HANDLERS: dict[type[Any], Callable[[Session, Any, proto.Batch], Wait | None]] = {
    proto.Alloc: Session._alloc,
    proto.Upload: Session._upload,
    proto.Readback: Session._readback,
    proto.Free: Session._free,
    proto.RegisterKernel: Session._kernel,
    proto.Sync: Session._sync,
    proto.Copy: Session._copy,
    proto.Stats: Session._stats,
    proto.Publish: Session._publish,
    proto.Open: Session._open,
    proto.Unpublish: Session._unpublish,
    proto.Reshape: Session._reshape,
    proto.FlushOp: Session._flush,
    proto.BuildGraph: graph_ops.build_graph,
    proto.Replay: graph_ops.replay,
    proto.Launch: graph_ops.replay,
    proto.FreeGraph: graph_ops.free_graph,
    proto.PublishGraph: graph_ops.publish_graph,
    proto.OpenGraph: graph_ops.open_graph,
    proto.UnpublishGraph: graph_ops.unpublish_graph,
    proto.UploadPart: resident_ops.upload_part,
    proto.OpenPrefix: resident_ops.open_prefix,
    proto.ListResidents: resident_ops.list_residents,
}

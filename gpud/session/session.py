"""One connected client: its handles, kernels, quota and unacknowledged failures; runs its ops in order.

Ops run synchronously on the loop thread. An op that must wait (a compile, a full staging pool, a
device with too many submissions in flight) parks the session: its remaining ops, and later
batches, wait in a bounded backlog while a task awaits the condition and resumes the op. Other
sessions never wait for it.

Every op gets exactly one outcome: a request gets its reply (data or an error); any other op that
fails is kept in `failures` and answered on the session's next requests until acknowledged.

Here: the executor (ops in order, parking, resuming) and the outcomes. The ops themselves are the
parts' (`holdings`, `transfers`, `dispatching`, `requests`; `state` is what they share), and the
graph and resident ops' modules (`graph_ops`, `resident_ops`).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

import gpud_protocol as proto
from gpud.runtime.runtime import Wait
from gpud.session import graph_ops, resident_ops
from gpud.session.dispatching import Dispatching
from gpud.session.failures import Failure, Failures
from gpud.session.graphs import Family
from gpud.session.holdings import Holdings
from gpud.session.kernels import KernelTable
from gpud.session.prepared import PreparedDispatches
from gpud.session.requests import Requests
from gpud.session.state import Daemon, Send, Settings, Unacknowledged
from gpud.session.tensors import Handle, Tensor
from gpud.session.transfers import Transfers
from gpud_protocol import ErrorCode
from gpud_protocol.errors import Busy, GpudError, InternalError

__all__ = ["Daemon", "Send", "Session", "Settings"]

log = logging.getLogger(__name__)


class Session(Holdings, Transfers, Dispatching, Requests):
    def __init__(
        self, session_id: str, client: str, send: Send, daemon: Daemon, settings: Settings, device: int
    ) -> None:
        self.id = session_id
        self.client = client
        self._send = send
        self.send_in_order: Send = send  # what must reach the client in order with each other (readback parts)
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
        self.dispatch_memo: proto.DispatchMemo = self._prepared.memo  # for the decoder: entries it finds come prepared
        self.touched: set[int] = set()  # devices this session has encoded work on
        self.last_seen = time.monotonic()
        self.closed = False
        self.ops_done = 0
        self._received_at = 0.0

    def receive(self, batch: proto.Batch, received_at: float = 0.0) -> None:
        self.failures.acknowledge(batch.ack)
        if self._parked or self._backlog:
            if len(self._backlog) >= self._settings.session_window:
                self._refuse(batch, Busy(f"more than {self._settings.session_window} batches wait unexecuted"))
            else:
                self._backlog.append((batch, 0, received_at))
                self._prefetch(batch.ops)
            return
        self._run(batch, 0, received_at)

    def _run(self, batch: proto.Batch, start: int, received_at: float) -> None:
        self._received_at = received_at
        ops = batch.ops
        memoized, handlers, repeat = proto.Memoized, _HANDLERS, self._repeat
        for index in range(start, len(ops)):
            if self.closed:
                return
            op = ops[index]
            try:
                if type(op) is memoized:  # the hot path, without a lookup
                    wait = repeat(op)
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
        if type(batch.ops[index]) is proto.RegisterKernel:  # a compile: start the batch's next ones too
            self._prefetch(batch.ops[index + 1 :])
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

    def _failed(self, op: proto.Op | proto.OpError | proto.Memoized, exc: BaseException) -> None:
        if isinstance(op, proto.OpError):
            self._report(op.seq, op.op, _is_request_name(op.op), ErrorCode(op.code), op.message)
            return
        spec = proto.OPS[_OPCODE_OF[type(op)]]
        if isinstance(exc, Unacknowledged):  # a request answered with an earlier failure
            f = exc.failure
            if type(op) is proto.RegisterKernel:
                self.kernels.failed(op.handle, op.entry, f.text())
            self._send([proto.encode_error_reply(op.seq, f.code, f.text(), f.seq, f.op)])
            return
        if not isinstance(exc, GpudError):
            log.error("session %s: op #%s (%s) failed inside gpud", self.id, op.seq, spec.name, exc_info=exc)
            exc = InternalError(f"{type(exc).__name__}: {exc}")
        if type(op) is proto.RegisterKernel:
            self.kernels.failed(op.handle, op.entry, exc.message)
        self._report(op.seq, spec.name, spec.request, exc.code, exc.message)

    def _report(self, seq: int, opname: str, request: bool, code: ErrorCode, message: str) -> None:
        if request:  # a request gets its own answer
            self._send([proto.encode_error_reply(seq, code, message, seq, opname)])
        else:
            self.failures.add(Failure(seq, code, message, opname))

    def close(self) -> None:
        """Free private resources; resident tensors stay with their remaining references."""
        self.closed = True
        self._backlog.clear()
        families = list(self.graphs.values())
        self.graphs.clear()
        for family in families:
            graph_ops.leave(self, family)
            graph_ops.drop(self, family)
        for handle_id in list(self.handles):
            self._free_handle(handle_id)
        for tensor in list(self._charged):
            self._uncharge(tensor)
        self.kernels.clear()
        self._prepared.clear()


_OPCODE_OF = {spec.type: code for code, spec in proto.OPS.items()} | {proto.Memoized: proto.Opcode.DISPATCH}
_REQUEST_NAMES = frozenset(spec.name for spec in proto.OPS.values() if spec.request)


def _is_request_name(name: str) -> bool:
    return name in _REQUEST_NAMES


_HANDLERS: dict[type[Any], Callable[[Session, Any, proto.Batch], Wait | None]] = {
    proto.Dispatch: Session._dispatch,
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
    proto.ReplaySteps: graph_ops.replay_steps,
    proto.FreeGraph: graph_ops.free_graph,
    proto.PublishGraph: graph_ops.publish_graph,
    proto.OpenGraph: graph_ops.open_graph,
    proto.UnpublishGraph: graph_ops.unpublish_graph,
    proto.UploadPart: resident_ops.upload_part,
    proto.OpenPrefix: resident_ops.open_prefix,
    proto.ListResidents: resident_ops.list_residents,
}

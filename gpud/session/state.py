"""What every part of a `Session` shares: what it needs of the daemon and of the settings, its
state (set up by `Session.__init__`), and what every op does with it: find and check handles, admit
a request, reply.

A session is one object made of parts, one job each: `holdings` (tensor handles and the quota),
`transfers` (uploads and copies), `dispatching` (kernels and dispatches), `requests` (readbacks,
syncs, stats), each a class on `SessionState`, put together with the executor in `session`.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

import gpud_protocol as proto
from gpud.runtime.runtime import DeviceRuntime
from gpud.session.failures import Failure, Failures
from gpud.session.graphs import Family, GraphStore
from gpud.session.kernels import KernelTable
from gpud.session.prepared import PreparedDispatches
from gpud.session.residents import ResidentStore
from gpud.session.tensors import Handle, Tensor, view_of
from gpud_protocol import TensorView
from gpud_protocol.errors import Busy, GpudError, InvalidArgument, NotFound, OutOfMemory, PermissionDenied

Send = Callable[[list[Any]], None]


def other_process(device: int, own: int) -> str:
    """Why a session of a process-per-device worker cannot name another device."""
    return (
        f"device {device} is served by another process: the daemon runs a process per device "
        f"(process_per_device), and a session uses only its own device, {own}; connect(device={device}) "
        "for a session there"
    )


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
    def merge_replays(self) -> bool: ...

    @property
    def merge_wait_us(self) -> float: ...

    @property
    def trace(self) -> bool: ...


class ReplayQueue(Protocol):
    """Where a row-independent graph's replays wait to be launched together (`merging.Merger`)."""

    def add(self, family: Family, pending: Any) -> None: ...


class Daemon(Protocol):
    """What a session needs from the daemon around it."""

    runtimes: list[DeviceRuntime]
    residents: ResidentStore
    graph_store: GraphStore

    @property
    def merger(self) -> ReplayQueue: ...  # replays of row-independent graphs, until their slice ends

    def spawn(self, coroutine: Coroutine[Any, Any, None]) -> None: ...

    def after_work(self) -> None: ...


class Unacknowledged(GpudError):
    """A request answered with an earlier failure the client has not acknowledged."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.text())
        self.failure = failure


class SessionState:
    id: str
    client: str
    _send: Send
    send_in_order: Send
    _daemon: Daemon
    runtimes: list[DeviceRuntime]
    _residents: ResidentStore
    _graph_store: GraphStore
    _settings: Settings
    device: int  # the default device
    beat_key: str  # the secret a heartbeat from another socket must carry
    handles: dict[int, Handle]
    _held: Counter[Tensor]  # handles of this session per tensor
    _charged: set[Tensor]  # tensors counted in this session's quota
    private_bytes: list[int]  # per device
    kernels: KernelTable
    graphs: dict[int, Family]  # graph handles: families built or opened by this session
    _graph_names: dict[str, int]  # names of the families it built
    failures: Failures
    requests_in_flight: int
    reply_bytes_reserved: int
    _backlog: deque[tuple[proto.Batch, int, float]]  # batches waiting while the session is parked
    _parked: bool
    _prepared: PreparedDispatches
    dispatch_memo: proto.DispatchMemo  # for the decoder: the entries it finds come prepared
    touched: set[int]  # devices this session has encoded work on
    last_seen: float
    closed: bool
    ops_done: int
    _received_at: float  # when the batch running now was read from the socket
    # A readback's reply, sent part by part as its copies complete (`requests.ReadbackReply`).
    _readback_reply: Callable[[int, int, DeviceRuntime, dict[str, Any]], Any]

    def work_lost(self, error: GpudError) -> None:
        """A submission holding this session's work was refused (the daemon missed an invalid op)."""
        if not self.closed:
            self.failures.add(Failure(0, error.code, error.message, "submission"))

    def _admit(self) -> None:
        """A request may run: nothing unacknowledged failed before it, and the window has room."""
        if (first := self.failures.first()) is not None:
            raise Unacknowledged(first)
        if self.requests_in_flight >= self._settings.session_max_requests:
            raise Busy(f"more than {self._settings.session_max_requests} requests in flight")

    def _unreserve(self, nbytes: int) -> None:
        """A counted request that will get no reply (its encoding raised): its count given back."""
        self.requests_in_flight -= 1
        self.reply_bytes_reserved -= nbytes

    def _reply(self, seq: int, **fields: Any) -> None:
        self._send([proto.encode_reply(seq, **fields)])

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
        """The runtime of a device as the client numbers them (a process-per-device worker's are offset)."""
        first = self.runtimes[0]
        local = device - (first.number - first.index)
        if not 0 <= local < len(self.runtimes):
            if first.others_elsewhere:
                raise InvalidArgument(other_process(device, self.shown_device(self.device)))
            raise InvalidArgument(f"no device {device}: this daemon has {len(self.runtimes)}")
        return self.runtimes[local]

    def shown_device(self, device: int) -> int:
        """A device index as clients know it."""
        return self.runtimes[device].number

"""What every part of a `DeviceRuntime` shares: its settings, its state (set up by
`DeviceRuntime.__init__`), and the bookkeeping of the pending command buffer and of completions.

The runtime is one object made of parts, one job each: `memory`, `programs`, `encoding`,
`transfers`, `submission` (each a class on `RuntimeState`), put together in `runtime`.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections import defaultdict, deque
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from gpud.backends.base import Buffer, Device
from gpud.runtime.flush import FlushPolicy
from gpud.runtime.freed import FreedMemory
from gpud.runtime.ledger import CompletionLedger, Done
from gpud.runtime.pools import StagingPool
from gpud.runtime.submitter import Worker
from gpud.runtime.waits import settle
from gpud_protocol.errors import GpudError


class Prepared(NamedTuple):
    """A dispatch checked and packed once; `DeviceRuntime.dispatch` encodes it as often as asked."""

    buffers: tuple[Buffer, ...]  # marked as used by every submission that encodes it
    packed: Any  # the backend's packed form; None: an empty grid


class Owner(Protocol):
    """Whoever encodes work (a session): told when a submission holding its work was refused."""

    def work_lost(self, error: GpudError) -> None: ...


Deliver = Callable[[int, "bytes | memoryview | None", "BaseException | None"], None]


class RuntimeSettings(Protocol):
    @property
    def max_dispatches_per_flush(self) -> int: ...

    @property
    def flush_deadline_ms(self) -> float: ...

    @property
    def submission_target_s(self) -> float: ...

    @property
    def max_submissions_in_flight(self) -> int: ...

    @property
    def staging_pool_bytes(self) -> int: ...

    @property
    def kernel_cache_size(self) -> int: ...

    @property
    def reuse_memory_bytes(self) -> int: ...

    @property
    def pool_idle_release_s(self) -> float: ...


class RuntimeState:
    """The state `DeviceRuntime.__init__` sets up and its parts share, and what they all do with it:
    mark buffers used by the pending command buffer, and wait for completions."""

    device: Device
    index: int
    ledger: CompletionLedger
    policy: FlushPolicy
    max_in_flight: int
    uploads: StagingPool[Any]
    downloads: StagingPool[Any]
    chunk_bytes: int  # the largest piece of an upload
    part_bytes: int  # the largest part of a readback's reply
    freed: FreedMemory
    submitter: Worker  # submits and frees, in order
    _completion: threading.Condition  # the submit worker waits on it for serial submits
    _ids: itertools.count[int]
    encoded: int  # ops encoded since the last flush
    dispatches_pending: int
    dispatch_count: int
    counters: defaultdict[str, int]
    readback_latencies: deque[float]  # seconds from a readback part's copy encoded to its completion
    _awaited: bool  # a readback or sync waits on the pending command buffer
    _owners: set[Owner]  # who has work in the pending command buffer
    _unsaturated: asyncio.Future[None] | None
    closed: bool
    issued: int  # the last submission whose `submit` returned (they are issued in order)
    _on_issued: dict[int, list[Done]]  # submission -> what waits for it to be issued
    _holds: dict[int, int]  # allocation id -> copies between devices in flight that use it
    _held: dict[int, Buffer]  # allocations released while held: released at the last `unhold`

    neighbours: list[RuntimeState]  # every device's runtime of this daemon, this one's included

    @property
    def has_pending(self) -> bool:
        return self.encoded > 0

    @property
    def busy(self) -> bool:
        """Work encoded, or submitted and not yet completed."""
        return self.encoded > 0 or self.ledger.in_flight > 0

    def alone(self) -> bool:
        """No other device of this daemon has work: the loop thread may spend a moment on this one (submit
        inline, poll a completion) without making another device wait for it."""
        return all(rt is self or not rt.busy for rt in self.neighbours)

    @property
    def saturated(self) -> bool:
        """Too many submissions in flight: new GPU work waits (`unsaturated`) instead of piling up."""
        ledger = self.ledger
        return ledger.submitted - ledger.completed >= self.max_in_flight  # `in_flight`, on every dispatch

    def unsaturated(self) -> asyncio.Future[None]:
        if self._unsaturated is None or self._unsaturated.done():
            future: asyncio.Future[None] = self.device.loop.create_future()
            self._unsaturated = future
            self.counters["throttle_waits"] += 1
            self.ledger.after(self.ledger.completed + 1, lambda _error: settle(future, None))
        return self._unsaturated

    def _encoded_with(self, *buffers: Buffer) -> None:
        self.encoded += 1
        index = self.ledger.submitted + 1
        for buffer in buffers:
            buffer.last_use = index
            if buffer.base is not None:
                buffer.base.last_use = index

    def _check_alive(self) -> None:
        if self.ledger.lost is not None:
            raise self.ledger.lost

    def after(self, fn: Done) -> None:
        """Run `fn(error)` once all work encoded so far has completed (now, if it has)."""
        self.ledger.after(self.ledger.submitted + (1 if self.encoded else 0), fn)

    def after_pending(self, fn: Done) -> None:
        """Run `fn(error)` once the submission now being encoded has completed."""
        self.ledger.after(self.ledger.pending_index, fn)

    def after_use(self, buffer: Buffer, fn: Done) -> None:
        """Run `fn(error)` once the work using `buffer`'s allocation has completed: a view's own last use
        is not kept (a replay marks allocations alone, and a copy's target may be a view made for it)."""
        self.ledger.after((buffer.base or buffer).last_use, fn)

    def want_flush(self) -> None:
        """A result is awaited: flush at the end of this drain."""
        self._awaited = True
        self.policy.want()

    def after_issued(self, fn: Done) -> None:
        """Run `fn(error)` once every submission so far was issued to the device (its `submit` returned;
        `error`: that submission was refused). A marker's wait may be encoded on a peer from then on."""
        index = self.ledger.submitted
        if index <= self.issued:
            fn(None)
        else:
            self._on_issued.setdefault(index, []).append(fn)

    def _issued(self, index: int, error: BaseException | None) -> None:
        self.issued = max(self.issued, index)
        for waited in sorted(i for i in self._on_issued if i <= index):
            for fn in self._on_issued.pop(waited):
                fn(error if waited == index else None)

    def hold(self, buffer: Buffer) -> None:
        """Keep `buffer`'s allocation from being released until `unhold`: a copy between devices marks it
        used on this device only once the other device's part was issued."""
        allocation = buffer.base or buffer
        self._holds[allocation.id] = self._holds.get(allocation.id, 0) + 1

    def unhold(self, buffer: Buffer) -> None:
        allocation = buffer.base or buffer
        count = self._holds.pop(allocation.id) - 1
        if count:
            self._holds[allocation.id] = count
        elif (held := self._held.pop(allocation.id, None)) is not None:
            self.release(held)

    def release(self, buffer: Buffer) -> None:
        raise NotImplementedError  # `Memory.release`

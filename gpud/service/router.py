"""Where each message goes.

One reader takes the messages that are ready, a slice at a time (intake.py). A peer without a session
spends its budget (budget.py) before its message is even decoded. Pings, beats and status requests are
answered at once, before any work of the slice; batches, hellos and byes are then handled peer by peer,
round-robin (so no client starves): a batch goes to its session, which executes it or parks. Last, every
device runtime decides whether to flush, so work that arrives together lands in one command buffer.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import gpud_protocol as proto
from gpud.service.budget import OWN_BUDGET_ONLY, SessionlessBudget
from gpud.service.config import Config
from gpud.service.intake import Intake
from gpud.service.lifecycle import STOPPING, Lifecycle
from gpud.service.registry import Registry
from gpud.service.rings import OutOfOrder, Rings
from gpud_protocol import ErrorCode, ProtocolViolation
from gpud_protocol.errors import Busy
from gpud_protocol.schema import Status

log = logging.getLogger(__name__)


class Router:
    def __init__(
        self,
        config: Config,
        registry: Registry,
        budget: SessionlessBudget,
        lifecycle: Lifecycle,
        counters: defaultdict[str, int],
        status: Callable[[], dict[str, Any]],
        after_work: Callable[[], None],
        rings: Rings,
    ) -> None:
        self.config = config
        self._registry = registry
        self._budget = budget
        self._lifecycle = lifecycle
        self._counters = counters
        self._status = status  # the snapshot a status request is answered with
        self._after_work = after_work  # every device decides whether to flush
        self._rings = rings  # ring sessions' batches run in number order, whichever way they came

    async def receive_loop(self, intake: Intake) -> None:
        budget, registry, counters = self._budget, self._registry, self._counters
        sessions, send = registry.sessions, registry.send
        limits = self.config.limits
        while True:
            messages = await intake.next_slice()
            received_at = time.perf_counter()
            now = time.monotonic()
            counters["messages"] += len(messages)
            work: list[tuple[bytes, Any]] = []
            for identity, frames in messages:
                session = sessions.get(identity)
                if session is None and not budget.peer(identity, now):
                    continue  # over its own budget: dropped, not even decoded
                try:
                    memo = session.dispatch_memo if session is not None else None
                    message = proto.decode_client_message([f.buffer for f in frames], limits, memo)
                except ProtocolViolation as exc:
                    if session is None and not budget.total(now):
                        continue
                    counters["bad_messages"] += 1
                    level = logging.INFO if session is not None else logging.DEBUG  # garbage leaves no log flood
                    log.log(level, "bad message from %s: %s", identity.hex(), exc.message)
                    send(identity, [proto.encode_error(exc.code, exc.message)])
                    continue
                except Exception as exc:  # a decoder bug must not take the daemon down for everyone
                    if session is None and not budget.total(now):
                        continue
                    log.exception("internal error decoding a message from %s", identity.hex())
                    send(identity, [proto.encode_error(ErrorCode.INTERNAL, f"internal error decoding: {exc}")])
                    continue
                if session is not None:
                    session.last_seen = now
                elif type(message) not in OWN_BUDGET_ONLY and not budget.total(now):
                    continue
                if type(message) is proto.Ping and session is not None:
                    send(identity, [proto.PONG])  # answered before any work of this drain
                elif type(message) is proto.Beat:
                    registry.beat(identity, message)
                elif type(message) is proto.Doorbell:
                    counters["doorbells"] += 1  # the rings are read at every slice
                elif type(message) is Status:  # not an op: a session's status requests have that budget too
                    if session is None or budget.peer(identity, now):
                        counters["status_requests"] += 1
                        send(identity, [proto.pack({"t": "status", **self._status()})])
                else:
                    work.append((identity, message))
            for identity, message in _round_robin(work):
                try:
                    self._handle(identity, message, received_at)
                except Exception as exc:  # a bug must not take the daemon down for everyone
                    log.exception("internal error handling a message from %s", identity.hex())
                    send(identity, [proto.encode_error(ErrorCode.INTERNAL, f"internal error: {exc}")])
            self._after_work()

    def _handle(self, identity: bytes, message: Any, received_at: float) -> None:
        registry, counters = self._registry, self._counters
        session = registry.sessions.get(identity)
        stopping = self._lifecycle.stopping
        match message:
            case proto.Batch() if session is not None:
                counters["batches"] += 1
                counters["ops"] += len(message.ops)
                if stopping:
                    counters["refused_stopping"] += 1
                    session.failures.acknowledge(message.ack)
                    session._refuse(message, Busy(STOPPING))  # every op fails; each request is answered
                elif (ring := self._rings.get(identity)) is None:
                    session.receive(message, received_at)
                else:
                    try:
                        for batch in ring.order(message):
                            session.receive(batch, received_at)
                    except OutOfOrder as exc:
                        registry.end(identity, f"its batches came out of order: {exc}")
            case proto.Hello() if stopping:
                counters["refused_stopping"] += 1
                registry.send(identity, [proto.encode_error(ErrorCode.BUSY, f"{STOPPING}: connect to it again later")])
            case proto.Hello():
                registry.hello(identity, message)
            case proto.Bye():
                registry.end(identity, "said bye")
            case _:
                reason = registry.ended(identity)
                text = f"session ended: {reason}; connect again" if reason else "no session: send hello first"
                registry.send(identity, [proto.encode_error(ErrorCode.SESSION, text)])


def _round_robin(messages: list[tuple[bytes, Any]]) -> Iterator[tuple[bytes, Any]]:
    """Interleave messages of different peers, keeping each peer's own order."""
    queues: OrderedDict[bytes, list[Any]] = OrderedDict()
    for identity, message in messages:
        queues.setdefault(identity, []).append(message)
    while queues:
        for identity in list(queues):
            pending = queues[identity]
            yield identity, pending.pop(0)
            if not pending:
                del queues[identity]

"""The daemon's life: the event loop it runs on, and the ways it ends.

SIGTERM (or SIGINT) starts a drain: `STOPPING=1`, new sessions and new batches are refused with
Busy("the daemon is stopping"), work already accepted runs to its end for at most `drain_timeout_s`,
then every session still waiting is told its requests will not be answered, and the daemon exits 0.
A second signal during the drain stops it at once. A lost device stops it at once too, after every
session is told, and the daemon exits `EXIT_DEVICE_LOST`.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Callable, Coroutine
from typing import Any

import anyio

import gpud_protocol as proto
from gpud.runtime.runtime import DeviceRuntime
from gpud.service.config import Config
from gpud.service.notify import Notifier
from gpud.service.registry import Registry
from gpud.service.transport import Transport
from gpud.session.graphs import GraphStore
from gpud.session.residents import ResidentStore
from gpud.session.session import Session
from gpud_protocol import ErrorCode
from gpud_protocol.errors import DeviceLost

log = logging.getLogger(__name__)

EXIT_DEVICE_LOST = 3
STOPPING = "the daemon is stopping"


def run_loop(main: Coroutine[Any, Any, int], event_loop: str) -> int:
    """Run `main` on uvloop when it is installed (`event_loop` "auto"), else on asyncio's loop."""
    if event_loop != "asyncio":
        try:
            import uvloop
        except ImportError:
            if event_loop == "uvloop":
                main.close()
                raise
        else:
            return uvloop.run(main)
    return asyncio.run(main)


class Lifecycle:
    """Serving, then draining (`stopping`), then stopped."""

    def __init__(
        self,
        config: Config,
        runtimes: list[DeviceRuntime],
        registry: Registry,
        transport: Transport,
        notifier: Notifier,
        status_line: Callable[[], str],
    ) -> None:
        self.config = config
        self._runtimes = runtimes
        self._registry = registry
        self._transport = transport
        self._notifier = notifier
        self._status_line = status_line
        self.stopping = False  # draining after SIGTERM: new work is refused
        self.fatal: BaseException | None = None
        self.close_timeout = config.drain_timeout_s  # at shutdown: wait this long for the devices
        self._stop = anyio.Event()
        self._drain_asked = anyio.Event()

    def stop(self) -> None:
        """Stop now, without a drain (tests; a fatal device error)."""
        self._stop.set()

    async def stopped(self) -> None:
        await self._stop.wait()

    def begin_stop(self, why: str) -> None:
        """Refuse new work, finish what was accepted (at most `drain_timeout_s`), then stop."""
        if self.stopping:
            return
        self.stopping = True
        log.info("%s: draining (at most %.1f s), new work is refused", why, self.config.drain_timeout_s)
        self._notifier.send("STOPPING=1", f"STATUS={self._status_line()}")
        self._drain_asked.set()

    async def signals(self) -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                name = signal.Signals(signum).name
                if self.stopping:
                    log.warning("%s during the drain: stopping now", name)
                    self.stop()
                    return
                self.begin_stop(name)

    async def drain_when_asked(self) -> None:
        """Until every accepted op has run and every request been answered, or `drain_timeout_s`."""
        await self._drain_asked.wait()
        timeout = self.config.drain_timeout_s
        deadline = time.monotonic() + timeout
        while not self._drained() and time.monotonic() < deadline:
            for rt in self._runtimes:
                if rt.has_pending:
                    rt.flush()
            await anyio.sleep(0.005)
        sessions = self._registry.sessions
        waiting = [identity for identity, session in sessions.items() if not _session_drained(session)]
        if waiting or not self._drained():
            log.warning("drain: work still pending after %.1f s (%d session(s) waiting)", timeout, len(waiting))
        for identity in waiting:
            text = f"{STOPPING}: its drain ({timeout:g} s) ended before this session's pending requests completed"
            self._registry.send(identity, [proto.encode_error(ErrorCode.SESSION, text)])
        self._transport.linger_ms = 1000
        log.info("drain done in %.2f s", timeout - max(0.0, deadline - time.monotonic()))
        self.close_timeout = max(0.0, deadline - time.monotonic())
        self.stop()

    def _drained(self) -> bool:
        if any(rt.has_pending or rt.ledger.in_flight for rt in self._runtimes):
            return False
        if self._transport.waiting():
            return False
        return all(_session_drained(session) for session in self._registry.sessions.values())

    def device_lost(self, rt: DeviceRuntime, error: DeviceLost) -> None:
        if self.fatal is None:
            self.fatal = error
            log.critical("device %d lost: %s", rt.number, error)
            for identity in list(self._registry.sessions):
                text = f"device {rt.number} lost: {error}"
                self._registry.send(identity, [proto.encode_error(ErrorCode.DEVICE_LOST, text)])
            self.stop()

    async def shutdown(self, residents: ResidentStore, graph_store: GraphStore) -> None:
        """End every session, release the published graphs and resident tensors, close the devices."""
        for identity in list(self._registry.sessions):
            self._registry.end(identity, STOPPING)
        for name in graph_store.names():
            family = graph_store.unpublish(name, by="")
            family.builder = None
            _drop_family(family, residents)
        residents.clear()
        for rt in self._runtimes:
            await rt.close(self.close_timeout)


def _session_drained(session: Session) -> bool:
    return not (session._parked or session._backlog or session.requests_in_flight)


def _drop_family(family: Any, residents: ResidentStore) -> None:
    """A published graph at shutdown: release what it holds (its sessions are gone)."""
    from gpud.session import graph_ops  # inside the session package's own import circle: imported late

    graph_ops.release(family, residents)

"""A process per device (`process_per_device`): the daemon as a front for one worker daemon per device.

One process serves every device from one event loop, and with light steps its Python (decoding,
checking, encoding each op under one interpreter lock) bounds it: a second GPU adds no dispatches a
second. With `process_per_device` and several devices on an ipc:// address, `gpud serve` starts one
worker per device instead (workers.py: the same daemon restricted to that device, on its own socket
beside this one) and keeps listening on the main socket, where it serves no session: it answers a
hello with a redirect to the worker of the device asked for, or of the least loaded one, and the
client follows it; a status request with every worker's status (front_status.py). Anything else from
a peer is refused.

Lifecycle: ready (READY=1) once every worker answers. SIGTERM/SIGINT: new hellos are refused, each
worker drains (it got the signal too) and exits, then the front exits 0; a second signal is passed
on (the workers stop at once). A worker that exits on its own (a lost device, a crash, SIGKILL)
stops the others and the front exits non-zero: the worker's status, or 1 after a signal. One device,
or no process_per_device: `Server` as always. tcp:// with it is refused at start-up (exit 2).
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

import gpud_protocol as proto
from gpud import __version__
from gpud.backends import chosen_devices
from gpud.service import front_status, workers
from gpud.service.budget import OWN_BUDGET_ONLY, SessionlessBudget
from gpud.service.config import Config
from gpud.service.health import Health, watch
from gpud.service.lifecycle import STOPPING
from gpud.service.metrics import MetricsServer
from gpud.service.notify import Notifier
from gpud.service.server import Server
from gpud.service.transport import Transport
from gpud.service.workers import Worker, WorkerFailed
from gpud_protocol import ErrorCode, ProtocolViolation
from gpud_protocol.schema import Status

log = logging.getLogger(__name__)

MAX_WAITING = 1024  # peers waiting for one refresh of the workers' status; more get the last one
NO_SESSION_HERE = (
    "no session here: this daemon runs a process per device (process_per_device); say hello and follow "
    "the redirect to a device's worker"
)


def daemon_for(config: Config, config_file: Path | None = None, verbose: bool = False) -> Server | Front:
    """The daemon `gpud serve` runs: a front when `process_per_device` has several devices to spread."""
    if not config.process_per_device:
        return Server(config, config_file)
    if not config.address.startswith("ipc://"):
        raise ValueError(f"process_per_device serves ipc:// addresses only, not {config.address}")
    _, ordinals = chosen_devices(config.backend, config.devices)
    if len(ordinals) < 2:
        log.info("process_per_device: one device, served by this process as without it")
        return Server(config, config_file)
    return Front(config, config_file, ordinals, verbose)


class Front:
    def __init__(self, config: Config, config_file: Path | None, ordinals: list[int], verbose: bool = False) -> None:
        self.config = config
        self.config_file = config_file
        self.started_at = time.monotonic()
        self.workers = workers.plan(config, ordinals)
        self.counters: defaultdict[str, int] = defaultdict(int)
        self.budget = SessionlessBudget(config.sessionless_rate, config.sessionless_total_rate)
        # No ring here: a session's ring is its worker's.
        self.transport = Transport(
            dataclasses.replace(config, ring_bytes=0), lambda peer, _why: self.transport.drop(peer)
        )
        self.notifier = Notifier()
        self.stopping = False
        self.exit_code = 0
        self._verbose = verbose
        self._stop = anyio.Event()
        self._tasks: anyio.abc.TaskGroup | None = None
        self._waiting: list[tuple[bytes, proto.Hello | None]] = []  # until the workers' status is fresh
        self._refreshing = False

    async def serve(self) -> int:
        """Start the workers, redirect hellos until a signal or a worker's exit; return the exit code."""
        config = self.config
        with self.transport.listening():
            log.info(
                "gpud %s serving %s as a front: a worker process per device (process_per_device), %d devices",
                __version__,
                config.address,
                len(self.workers),
            )
            metrics = None
            try:
                async with anyio.create_task_group() as tg:
                    self._tasks = tg
                    tg.start_soon(self._signals)
                    tg.start_soon(self._watch_workers)
                    for worker in self.workers:
                        workers.start(config, worker, self._verbose)
                    async with anyio.create_task_group() as starting:
                        for worker in self.workers:
                            starting.start_soon(self._ready, worker)
                    if not (self._stop.is_set() or self.stopping):
                        if config.metrics_address:
                            metrics = MetricsServer(config.metrics_address, self.status)
                            await metrics.start()
                        tg.start_soon(self._receive_loop)
                        tg.start_soon(self.transport.retry_loop)
                        tg.start_soon(self._poll_loop)
                        tg.start_soon(watch, self._assess, self.notifier, self.status_line)
                        self.notifier.send("READY=1", f"STATUS={self.status_line()}")
                        log.info("every worker is ready: %s", ", ".join(w.address for w in self.workers))
                    await self._stop.wait()
                    tg.cancel_scope.cancel()
            finally:
                if metrics is not None:
                    metrics.close()
                with anyio.CancelScope(shield=True):
                    await workers.stop(self.workers, config.drain_timeout_s + 10)
                self.notifier.close()
        return self.exit_code

    def stop(self, code: int = 0) -> None:
        if code and not self.exit_code:
            self.exit_code = code
        self._stop.set()

    def status(self) -> dict[str, Any]:
        return front_status.snapshot(self)

    def status_line(self) -> str:
        return front_status.status_line(self)

    def _assess(self, now: float) -> Health:
        return front_status.health(self, now)

    # ------------------------------------------------------------------ the workers

    async def _ready(self, worker: Worker) -> None:
        try:
            await workers.ready(worker)
        except WorkerFailed as exc:
            if not self.stopping:
                log.error("%s: stopping the others", exc)
                self.stop(worker.exit_code() or 1)

    async def _watch_workers(self) -> None:
        """A worker that exits: the end of the front (a lost device is fatal to one daemon too); once all
        have exited after a signal, the end of the drain."""
        while True:
            await anyio.sleep(0.05)
            codes = [w.exit_code() for w in self.workers]
            if self.stopping:
                if all(code is not None for code in codes):
                    self.stop()
                    return
                continue
            for worker, code in zip(self.workers, codes, strict=True):
                if code is not None:
                    log.error(
                        "the worker of device %d (pid %d) exited with %d: stopping the others",
                        worker.number,
                        worker.pid,
                        code,
                    )
                    self.stopping = True
                    self.stop(code if code > 0 else 1)
                    return

    async def _poll_loop(self) -> None:
        while True:
            await self._poll_all()
            await anyio.sleep(workers.POLL_S)

    async def _poll_all(self) -> None:
        async with anyio.create_task_group() as tg:
            for worker in self.workers:
                tg.start_soon(workers.poll, worker, 1.0)

    async def _signals(self) -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                name = signal.Signals(signum).name
                workers.signal_all(self.workers, signal.SIGTERM)  # a second one stops a draining worker at once
                if self.stopping:
                    log.warning("%s during the drain: the workers stop now", name)
                    continue
                self.stopping = True
                log.info(
                    "%s: the workers drain (at most %.1f s), new sessions are refused",
                    name,
                    self.config.drain_timeout_s,
                )
                self.notifier.send("STOPPING=1", f"STATUS={self.status_line()}")

    # ------------------------------------------------------------------ the socket

    async def _receive_loop(self) -> None:
        intake, budget, limits, counters = self.transport.intake, self.budget, self.config.limits, self.counters
        while True:
            messages = await intake.next_slice()
            now = time.monotonic()
            counters["messages"] += len(messages)
            for identity, frames in messages:
                if not budget.peer(identity, now):
                    continue  # over its own budget: dropped, not even decoded
                try:
                    message = proto.decode_client_message([f.buffer for f in frames], limits, None)
                except ProtocolViolation as exc:
                    if budget.total(now):
                        counters["bad_messages"] += 1
                        self._send(identity, proto.encode_error(exc.code, exc.message))
                    continue
                except Exception as exc:  # a decoder bug must not take the daemon down for everyone
                    if budget.total(now):
                        log.exception("internal error decoding a message from %s", identity.hex())
                        self._send(identity, proto.encode_error(ErrorCode.INTERNAL, f"internal error decoding: {exc}"))
                    continue
                if type(message) not in OWN_BUDGET_ONLY and not budget.total(now):
                    continue
                self._handle(identity, message)

    def _handle(self, identity: bytes, message: Any) -> None:
        match message:
            case proto.Hello():
                self._hello(identity, message)
            case Status():
                self.counters["status_requests"] += 1
                self._after_refresh(identity, None)
            case proto.Bye():
                pass  # a probe's goodbye (`spawn.answers`): there is no session to end
            case _:
                self._send(identity, proto.encode_error(ErrorCode.SESSION, NO_SESSION_HERE))

    def _hello(self, identity: bytes, hello: proto.Hello) -> None:
        if hello.version != proto.PROTOCOL_VERSION:
            text = f"protocol version {hello.version} unsupported; this daemon speaks {proto.PROTOCOL_VERSION}"
            self._send(identity, proto.encode_error(ErrorCode.PROTOCOL, text))
        elif hello.device is not None and hello.device >= len(self.workers):
            text = f"no device {hello.device}: this daemon has {len(self.workers)}"
            self._send(identity, proto.encode_error(ErrorCode.INVALID_ARGUMENT, text))
        elif hello.device is not None:
            self._redirect(identity, self.workers[hello.device])
        else:  # to the least loaded worker, by session counts asked afresh
            self._after_refresh(identity, hello)

    def _redirect(self, identity: bytes, worker: Worker) -> None:
        if self.stopping:
            self.counters["refused_stopping"] += 1
            self._send(identity, proto.encode_error(ErrorCode.BUSY, f"{STOPPING}: connect to it again later"))
            return
        worker.redirects += 1
        self.counters["redirects"] += 1
        self._send(identity, proto.encode_redirect(worker.address, worker.number))

    def _after_refresh(self, identity: bytes, hello: proto.Hello | None) -> None:
        """Answer a status request (`hello` None) or place a hello once every worker was asked for its
        status afresh: one refresh at a time, shared by all who wait for it."""
        if len(self._waiting) >= MAX_WAITING:
            self._answer(identity, hello)  # with what the last refresh said
            return
        self._waiting.append((identity, hello))
        if not self._refreshing and self._tasks is not None:
            self._refreshing = True
            self._tasks.start_soon(self._refresh)

    async def _refresh(self) -> None:
        try:
            await self._poll_all()
        finally:
            self._refreshing = False
            waiting, self._waiting = self._waiting, []
            status: bytes | None = None
            for identity, hello in waiting:
                if hello is not None:
                    self._answer(identity, hello)
                else:
                    status = status or proto.pack({"t": "status", **self.status()})
                    self._send(identity, status)

    def _answer(self, identity: bytes, hello: proto.Hello | None) -> None:
        if hello is None:
            self._send(identity, proto.pack({"t": "status", **self.status()}))
        else:
            self._redirect(identity, min(self.workers, key=Worker.load))

    def _send(self, identity: bytes, frame: bytes) -> None:
        self.transport.send(identity, [frame], True)

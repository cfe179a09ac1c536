"""The daemon, wired: its socket, its sessions, where messages go, how it stops, and what it shows.

Parts: `transport` (the ROUTER socket, the lock file, CURVE, the outboxes), `registry` (sessions and
their leases), `router` (each message to where it goes), `lifecycle` (signals, the drain, a lost
device), `status` (the snapshot and systemd's STATUS= line), `health` (the watchdog). The loop never
waits for a GPU: a session that must wait parks on its own, and replies go out through per-peer
outboxes that never block.

As a service: `READY=1` goes to systemd once every device is open and the socket bound; a task on
the loop sends `STATUS=` every few seconds and `WATCHDOG=1` while work makes progress (health.py);
SIGTERM starts a drain (lifecycle.py).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import time
from collections import defaultdict
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from gpud import __version__
from gpud.backends import open_devices
from gpud.runtime.runtime import DeviceRuntime
from gpud.service import status
from gpud.service.budget import SessionlessBudget
from gpud.service.config import Config
from gpud.service.health import Health, watch
from gpud.service.lifecycle import EXIT_DEVICE_LOST, Lifecycle
from gpud.service.metrics import MetricsServer
from gpud.service.notify import Notifier
from gpud.service.registry import Registry
from gpud.service.router import Router
from gpud.service.transport import Transport
from gpud.session.graphs import GraphStore
from gpud.session.merging import Merger
from gpud.session.residents import ResidentStore
from gpud.session.tensors import Tensor

log = logging.getLogger(__name__)


class Server:
    def __init__(self, config: Config, config_file: Path | None = None, worker_device: int | None = None) -> None:
        self.config = config
        self.worker_device = worker_device  # a process-per-device worker: its device, as its front numbers them
        self.config_file = config_file  # where the settings came from (None: defaults and flags)
        self.started_at = time.monotonic()
        self.runtimes: list[DeviceRuntime] = []  # filled once the devices are open
        self.counters: defaultdict[str, int] = defaultdict(int)
        self.notifier = Notifier()
        self.budget = SessionlessBudget(config.sessionless_rate, config.sessionless_total_rate)
        self.transport = Transport(config, self._peer_stuck)
        self.registry = Registry(config, self, self.transport, self.counters)
        connected = self.registry.is_connected
        self.residents = ResidentStore(self._release, connected, config.resident_max_count, config.resident_max_bytes)
        self.graph_store = GraphStore(connected)
        self.merger = Merger()
        self.lifecycle = Lifecycle(
            config, self.runtimes, self.registry, self.transport, self.notifier, self.status_line
        )
        self.router = Router(
            config,
            self.registry,
            self.budget,
            self.lifecycle,
            self.counters,
            self.status,
            self.after_work,
            self.transport.rings,
        )
        self.transport.authenticate = self.registry.authenticate
        self._tasks: anyio.abc.TaskGroup | None = None
        self._metrics: MetricsServer | None = None

    async def serve(self, ready: anyio.Event | None = None) -> int:
        """Run until SIGTERM/SIGINT, `stop()`, or a fatal device error; return the exit code."""
        config, lifecycle, worker_device = self.config, self.lifecycle, self.worker_device
        with self.transport.listening():
            loop = asyncio.get_running_loop()
            devices = open_devices(config.backend, config.devices, loop, config)
            self.runtimes.extend(
                DeviceRuntime(device, config, lifecycle.device_lost, config.limits.reply_part_bytes)
                for device in devices
            )
            for rt in self.runtimes:
                rt.neighbours = list(self.runtimes)
                if worker_device is not None:
                    rt.number, rt.others_elsewhere = worker_device, True
            # Submit workers, completion threads and wgpu's poll thread take the GIL back after every
            # driver call; at Python's 5 ms interval a busy loop thread (or one polling the rings) holds
            # it that long first, and each completion waits behind it.
            sys.setswitchinterval(config.gil_switch_us / 1e6)
            # Long-lived startup objects need no more scanning, and the hot path allocates many
            # short-lived tuples: a larger first generation cuts collection pauses by about a quarter.
            gc.freeze()
            gc.set_threshold(50_000, 20, 100)
            for rt in self.runtimes:
                log.info("device %d: %s", rt.number, _describe(rt.info()))
                if rt.device.software:
                    log.warning(
                        "device %d is a software rasteriser (lavapipe): slow, and Mesa cuts every shader loop "
                        "at 65,535 iterations, silently",
                        rt.number,
                    )
            log.info(
                "gpud %s serving %s with %d device(s); settings: %s",
                __version__,
                config.address,
                len(self.runtimes),
                self.config_file or "defaults and flags (no config file)",
            )
            try:
                if config.metrics_address:  # a port in use: one line, exit 2, the devices closed
                    self._metrics = MetricsServer(config.metrics_address, self.status)
                    await self._metrics.start()
                async with anyio.create_task_group() as tg:
                    self._tasks = tg
                    tg.start_soon(self.router.receive_loop, self.transport.intake)
                    tg.start_soon(self.registry.lease_loop)
                    tg.start_soon(self.transport.retry_loop)
                    tg.start_soon(lifecycle.signals)
                    tg.start_soon(lifecycle.drain_when_asked)
                    tg.start_soon(watch, self._assess, self.notifier, self.status_line)
                    if ready is not None:
                        ready.set()
                    self.notifier.send("READY=1", f"STATUS={self.status_line()}")
                    await lifecycle.stopped()
                    tg.cancel_scope.cancel()
            finally:
                if self._metrics is not None:
                    self._metrics.close()
                await lifecycle.shutdown(self.residents, self.graph_store)
                self.notifier.close()
        if lifecycle.fatal is not None:
            log.error("exiting after a fatal device error: %s", lifecycle.fatal)
            return EXIT_DEVICE_LOST
        return 0

    def stop(self) -> None:
        """Stop now, without a drain (tests; a fatal device error)."""
        self.lifecycle.stop()

    def status(self) -> dict[str, Any]:
        return status.snapshot(self)

    def status_line(self) -> str:
        return status.status_line(self)

    def _assess(self, now: float) -> Health:
        return status.health(self, now)

    # ------------------------------------------------------------------ what sessions use

    def spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        """Run a parked session's resumption in the server's task group."""
        assert self._tasks is not None

        async def run() -> None:
            try:
                await coroutine
            except Exception:  # a bug in one session must not take the daemon down
                log.exception("a session task failed")

        self._tasks.start_soon(run)

    def after_work(self) -> None:
        if self.merger:  # replays of row-independent graphs read in this slice, merged where they can be
            self.merger.run()
        for rt in self.runtimes:
            rt.after_drain()

    def _release(self, tensor: Tensor) -> None:
        self.runtimes[tensor.device].release(tensor.buffer)

    def _peer_stuck(self, identity: bytes, reason: str) -> None:
        self.registry.end(identity, reason)


def _describe(info: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in info.items() if k not in ("index",))

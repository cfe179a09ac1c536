"""The worker processes of a process-per-device front: one daemon per device, each on its own ipc://
socket beside the front's (`<socket>.dev<i>`, same directory and mode), with the front's settings but
that one device and no metrics endpoint.

A worker is `python -m gpud.service.worker`, its settings in `GPUD_WORKER` (JSON, validated like a
config file). It dies with the front (PR_SET_PDEATHSIG), so a front killed outright leaves no worker
behind. It is ready once it answers a status request; the front then asks it for its status every
`POLL_S` (its session count places new sessions; `gpud status` shows it).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio

from gpud.service import admin
from gpud.service.config import Config, config_fields

log = logging.getLogger(__name__)

WORKER_ENV = "GPUD_WORKER"
POLL_S = 1.0  # between status requests to each worker
START_TIMEOUT_S = 120.0  # for a worker to open its device and answer
# Not the worker's: systemd talks to the front alone (READY=, the watchdog), which speaks for all.
_FRONT_ONLY = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID")


class WorkerFailed(RuntimeError):
    """A worker exited, or did not start."""


@dataclasses.dataclass
class Worker:
    number: int  # its device, as the front numbers them (what clients name)
    ordinal: int  # the same device, as the backend numbers them
    address: str
    proc: subprocess.Popen[bytes] | None = None
    status: dict[str, Any] | None = None  # its last status answer
    polled_at: float = 0.0  # when that answer came (monotonic)
    redirects: int = 0  # clients sent to it
    counted: int = 0  # redirects sent before the last answered status request: counted in it

    def load(self) -> tuple[int, int, int]:
        """Least loaded first: sessions (and clients sent since its last status), memory in use, index."""
        status = self.status or {}
        sessions = int(status.get("session_count", 0)) + self.redirects - self.counted
        memory = sum(int(d.get("memory_in_use", 0)) for d in status.get("devices", ()))
        return sessions, memory, self.number

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc is not None else 0

    def exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()


def plan(config: Config, ordinals: list[int]) -> list[Worker]:
    """A worker per device: device i (as the front numbers them) at `<socket>.dev<i>`."""
    return [Worker(number, ordinal, f"{config.address}.dev{number}") for number, ordinal in enumerate(ordinals)]


def settings(config: Config, worker: Worker) -> dict[str, Any]:
    """The front's settings as a worker's [gpud] table: its own socket and device, no metrics endpoint."""
    values: dict[str, Any] = {}
    for name in config_fields():
        value = getattr(config, name)
        values[name] = value.as_dict() if name == "limits" else str(value) if isinstance(value, Path) else value
    return values | {"address": worker.address, "devices": [worker.ordinal], "metrics_address": ""}


def start(config: Config, worker: Worker, verbose: bool) -> None:
    """Start the worker's process (from the loop's thread: PR_SET_PDEATHSIG follows the thread that forks)."""
    spec = {"settings": settings(config, worker), "device": worker.number, "front": os.getpid(), "verbose": verbose}
    env = {k: v for k, v in os.environ.items() if k not in _FRONT_ONLY} | {WORKER_ENV: json.dumps(spec)}
    worker.proc = subprocess.Popen([sys.executable, "-m", "gpud.service.worker"], env=env, stdin=subprocess.DEVNULL)
    log.info("worker for device %d (pid %d) starting at %s", worker.number, worker.pid, worker.address)


async def ready(worker: Worker, timeout: float = START_TIMEOUT_S) -> None:
    """Until the worker answers a status request; WorkerFailed if it exits or takes too long."""
    deadline = time.monotonic() + timeout
    while True:
        if (code := worker.exit_code()) is not None:
            raise WorkerFailed(f"the worker for device {worker.number} exited with {code} while starting")
        if time.monotonic() > deadline:
            raise WorkerFailed(f"the worker for device {worker.number} did not answer within {timeout:g} s")
        if await poll(worker, 1.0):
            log.info("worker for device %d (pid %d) ready", worker.number, worker.pid)
            return
        await anyio.sleep(0.05)


async def poll(worker: Worker, timeout: float = 2.0) -> bool:
    """Ask the worker for its status; False if it did not answer."""
    redirects = worker.redirects
    try:
        status = await anyio.to_thread.run_sync(admin.query, worker.address, timeout)
    except admin.Unreachable:
        return False
    worker.status, worker.polled_at, worker.counted = status, time.monotonic(), redirects
    return True


def signal_all(workers: list[Worker], signum: int) -> None:
    for worker in workers:
        if worker.proc is not None and worker.proc.poll() is None:
            worker.proc.send_signal(signum)


async def stop(workers: list[Worker], timeout: float) -> None:
    """SIGTERM (each drains), wait up to `timeout`, then SIGKILL whichever is left."""
    signal_all(workers, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while any(w.exit_code() is None for w in workers) and time.monotonic() < deadline:
        await anyio.sleep(0.02)
    for worker in workers:
        if worker.proc is not None and worker.proc.poll() is None:
            log.warning(
                "worker for device %d (pid %d) did not stop in %.0f s: killed", worker.number, worker.pid, timeout
            )
            worker.proc.kill()
            worker.proc.wait()


def describe(worker: Worker, now: float) -> dict[str, Any]:
    """One worker, for `gpud status`."""
    status = worker.status or {}
    return {
        "device": worker.number,
        "address": worker.address,
        "pid": worker.pid,
        "alive": worker.exit_code() is None,
        "state": status.get("state", "starting"),
        "healthy": bool(status.get("health", {}).get("healthy", False)),
        "session_count": int(status.get("session_count", 0)),
        "status_age_s": round(now - worker.polled_at, 3) if worker.polled_at else None,
    }

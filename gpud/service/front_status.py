"""A process-per-device front seen from outside: its workers' status snapshots put together, in the shape
of one daemon's (`status.snapshot`), so `gpud status`, `gpud stats` and the metrics endpoint read it
unchanged, plus a "workers" list (each worker's device, address, pid, session count).

Devices, sessions, residents and graphs are the workers' lists one after the other (each says its device
as the front numbers them); counters are summed over the workers, with the front's own added (hellos
redirected, messages and status requests it read). A worker's part is its last answer to the front's
polling (at most about a second old; `status_age_s`), refreshed before a status request is answered.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import gpud_protocol as proto
from gpud import __version__
from gpud.service import workers
from gpud.service.budget import SessionlessBudget
from gpud.service.config import Config
from gpud.service.health import Health
from gpud.service.status import LIST_CAP
from gpud.service.transport import Transport
from gpud.service.workers import Worker

STALE_S = 10.0  # a worker that has not answered the front's polling this long is unhealthy


class Front(Protocol):
    """What the snapshot reads."""

    @property
    def config(self) -> Config: ...
    @property
    def config_file(self) -> Path | None: ...
    @property
    def started_at(self) -> float: ...
    @property
    def stopping(self) -> bool: ...
    @property
    def workers(self) -> list[Worker]: ...
    @property
    def counters(self) -> Mapping[str, int]: ...
    @property
    def transport(self) -> Transport: ...
    @property
    def budget(self) -> SessionlessBudget: ...


def health(front: Front, now: float) -> Health:
    """Healthy while every worker runs, answers, and says it is healthy."""
    problems: list[str] = []
    for worker in front.workers:
        name = f"the worker of device {worker.number} (pid {worker.pid})"
        status = worker.status
        if (code := worker.exit_code()) is not None:
            problems.append(f"{name} exited with {code}")
        elif status is None:
            problems.append(f"{name} has not answered yet")
        elif now - worker.polled_at > STALE_S:
            problems.append(f"{name} has not answered for {now - worker.polled_at:.1f} s")
        elif not status.get("health", {}).get("healthy", False):
            problems += [f"device {worker.number}: {p}" for p in status.get("health", {}).get("problems", [])]
    return Health(not problems, tuple(problems), ())


def status_line(front: Front) -> str:
    """systemd's STATUS=: workers, sessions and health, in one line."""
    state = "stopping (draining)" if front.stopping else "serving"
    sessions = sum(int((w.status or {}).get("session_count", 0)) for w in front.workers)
    summary = health(front, time.monotonic()).summary()
    return f"{state}: a process per device, {len(front.workers)} worker(s), {sessions} session(s); {summary}"


def snapshot(front: Front) -> dict[str, Any]:
    """What `gpud status` shows of a front (msgpack-safe)."""
    now = time.monotonic()
    config, parts = front.config, [w.status or {} for w in front.workers]
    assessed = health(front, now)
    counters: Counter[str] = Counter()
    for part in parts:
        counters.update({k: v for k, v in part.get("counters", {}).items() if type(v) is int})
    counters.update(front.counters)
    counters["sessionless_dropped"] += front.budget.dropped
    counters["sessionless_replies_dropped"] += front.transport.sessionless_dropped

    def joined(key: str) -> list[Any]:
        return [item for part in parts for item in part.get(key, [])][:LIST_CAP]

    def total(key: str) -> int:
        return sum(int(part.get(key, 0)) for part in parts)

    return {
        "version": __version__,
        "protocol": proto.PROTOCOL_VERSION,
        "pid": os.getpid(),
        "address": config.address,
        "config_file": str(front.config_file or ""),
        "backend": next((str(p["backend"]) for p in parts if p.get("backend")), ""),
        "state": "stopping" if front.stopping else "serving",
        "uptime_s": round(now - front.started_at, 3),
        "health": {"healthy": assessed.healthy, "problems": list(assessed.problems), "stall_s": config.health_stall_s},
        "devices": [device for part in parts for device in part.get("devices", [])],
        "session_count": total("session_count"),
        "sessions": joined("sessions"),
        "resident_count": total("resident_count"),
        "residents": joined("residents"),
        "graph_count": total("graph_count"),
        "graphs": joined("graphs"),
        "counters": dict(counters),
        "outboxes": front.transport.stats(),
        "sessionless_peers": len(front.budget),
        "process_per_device": True,
        "workers": [workers.describe(w, now) for w in front.workers],
    }

"""The daemon seen from outside: one snapshot for `gpud status`, `gpud stats` and the metrics endpoint,
and one line for systemd's `STATUS=`.

A `{"t": "status"}` message is answered with `snapshot()` without a session. Lists (sessions, residents,
graphs) stop at `LIST_CAP` entries; their totals are exact.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import gpud_protocol as proto
from gpud import __version__
from gpud.runtime.runtime import DeviceRuntime
from gpud.service.budget import SessionlessBudget
from gpud.service.config import Config
from gpud.service.health import Health, assess
from gpud.service.lifecycle import Lifecycle
from gpud.service.registry import Registry
from gpud.service.transport import Transport
from gpud.session.graphs import GraphStore
from gpud.session.residents import ResidentStore
from gpud.session.tensors import Tensor

LIST_CAP = 1024  # sessions, residents and graphs listed in a status reply (the totals are exact)


class Daemon(Protocol):
    """What the snapshot reads."""

    @property
    def config(self) -> Config: ...
    @property
    def config_file(self) -> Path | None: ...  # where the settings came from (None: defaults and flags)
    @property
    def started_at(self) -> float: ...
    @property
    def runtimes(self) -> list[DeviceRuntime]: ...
    @property
    def counters(self) -> Mapping[str, int]: ...
    @property
    def registry(self) -> Registry: ...
    @property
    def residents(self) -> ResidentStore: ...
    @property
    def graph_store(self) -> GraphStore: ...
    @property
    def transport(self) -> Transport: ...
    @property
    def budget(self) -> SessionlessBudget: ...
    @property
    def lifecycle(self) -> Lifecycle: ...


def health(daemon: Daemon, now: float | None = None) -> Health:
    now = time.monotonic() if now is None else now
    return assess(daemon.runtimes, daemon.config.health_stall_s, now, daemon.lifecycle.fatal)


def status_line(daemon: Daemon) -> str:
    """systemd's STATUS=: devices, sessions, queued work and health, in one line."""
    queued = sum(rt.encoded for rt in daemon.runtimes)
    in_flight = sum(rt.ledger.in_flight for rt in daemon.runtimes)
    state = "stopping (draining)" if daemon.lifecycle.stopping else "serving"
    return (
        f"{state}: {len(daemon.runtimes)} device(s), {len(daemon.registry.sessions)} session(s), {queued} op(s) "
        f"queued, {in_flight} submission(s) in flight; {health(daemon).summary()}"
    )


def snapshot(daemon: Daemon) -> dict[str, Any]:
    """Everything `gpud status`, `gpud stats` and the metrics endpoint show (msgpack-safe)."""
    now = time.monotonic()
    config, runtimes, registry = daemon.config, daemon.runtimes, daemon.registry
    assessed = health(daemon, now)
    transport, budget = daemon.transport, daemon.budget
    base = runtimes[0].number - runtimes[0].index if runtimes else 0  # a process-per-device worker's offset
    return {
        "version": __version__,
        "protocol": proto.PROTOCOL_VERSION,
        "pid": os.getpid(),
        "address": config.address,
        "config_file": str(daemon.config_file or ""),
        "backend": runtimes[0].device.kind if runtimes else "",
        "state": "stopping" if daemon.lifecycle.stopping else "serving",
        "uptime_s": round(now - daemon.started_at, 3),
        "gil_switch_us": round(sys.getswitchinterval() * 1e6, 1),
        "health": {
            "healthy": assessed.healthy,
            "problems": list(assessed.problems),
            "stall_s": config.health_stall_s,
        },
        "devices": [_device(rt, stall) for rt, stall in zip(runtimes, assessed.stalled, strict=True)],
        "session_count": len(registry.sessions),
        "sessions": _sessions(registry, now),
        "resident_count": len(daemon.residents),
        "residents": _residents(daemon.residents, registry, base),
        "graph_count": len(daemon.graph_store),
        "graphs": _graphs(daemon.graph_store, registry, base),
        "counters": {
            **daemon.counters,
            "sessionless_dropped": budget.dropped,
            "sessionless_replies_dropped": transport.sessionless_dropped,
        },
        "outboxes": transport.stats(),
        "rings": transport.rings.stats(),
        "sessionless_peers": len(budget),  # peers without a session whose budget is remembered
    }


def _sessions(registry: Registry, now: float) -> list[dict[str, Any]]:
    out = []
    for session in list(registry.sessions.values())[:LIST_CAP]:
        name, pid, opened = registry.clients.get(session.id, ("?", 0, now))
        out.append(
            {
                "id": session.id,
                "client": name,
                "pid": pid,
                "device": session.shown_device(session.device),
                "connected_s": round(now - opened, 3),
                "idle_s": round(max(0.0, now - session.last_seen), 3),
                "memory_bytes": sum(session.private_bytes),
                "handles": len(session.handles),
                "kernels": len(session.kernels),
                "graphs": len(session.graphs),
                "ops": session.ops_done,
                "requests_in_flight": session.requests_in_flight,
            }
        )
    return out


def _client_of(registry: Registry, session_id: str) -> str:
    name, pid, _ = registry.clients.get(session_id, ("", 0, 0.0))
    return f"{name} (pid {pid})" if name or pid else "(gone)"


def _residents(residents: ResidentStore, registry: Registry, base: int) -> list[dict[str, Any]]:
    by_name: dict[str, Tensor] = residents._by_name  # read-only view of the store
    out = []
    for name in residents.names()[:LIST_CAP]:
        tensor = by_name[name]
        out.append(
            {
                "name": name,
                "dtype": tensor.dtype,
                "shape": list(tensor.shape),
                "nbytes": tensor.nbytes,
                "device": tensor.device + base,
                "mode": tensor.mode,
                "publisher": _client_of(registry, tensor.publisher),
                "refs": tensor.refs,
            }
        )
    return out


def _graphs(graph_store: GraphStore, registry: Registry, base: int) -> list[dict[str, Any]]:
    by_name: dict[str, Any] = graph_store._by_name  # read-only view of the store
    out = []
    for name in graph_store.names()[:LIST_CAP]:
        family = by_name[name]
        out.append(
            {
                "name": name,
                "device": family.device + base,
                "builder": _client_of(registry, family.owner),
                "nbytes": family.nbytes,
                "instances": len(family.instances),
                "refs": family.refs,
            }
        )
    return out


def _device(rt: DeviceRuntime, stalled: float) -> dict[str, Any]:
    """One device: gauges at the top level, monotonic counters under "counters"."""
    stats = rt.stats()
    info = rt.info()
    flushes = int(stats.get("flushes", 0))
    cache, up, down = stats["program_cache"], stats["upload_staging"], stats["download_staging"]
    counters = {k: v for k, v in stats.items() if type(v) in (int, float) and k not in _GAUGE_KEYS}
    counters |= {
        "kernel_cache_hits": cache["hits"],
        "kernel_cache_misses": cache["misses"],
        "kernel_cache_evictions": cache.get("evictions", 0),
        "upload_staging_hits": up.get("hits", 0),
        "upload_staging_misses": up.get("misses", 0),
        "upload_staging_waits": up["exhausted_waits"],
        "download_staging_hits": down.get("hits", 0),
        "download_staging_misses": down.get("misses", 0),
        "download_staging_waits": down["exhausted_waits"],
    }
    if (groups := stats.get("bind_group_cache")) is not None:  # webgpu
        counters |= {f"bind_group_{k}": groups[k] for k in ("hits", "misses", "evictions")}
    latencies = sorted(rt.readback_latencies)
    return {
        "index": rt.number,
        "name": str(info.get("name", "")),
        "backend": rt.device.kind,
        "memory_in_use": rt.memory_in_use,
        "memory_total": info.get("memory_total"),
        "memory_free": info.get("memory_free"),
        "live_buffers": rt.live_buffers,
        "sessions": rt.sessions,
        "pending_ops": rt.encoded,
        "in_flight": rt.ledger.in_flight,
        "stalled_s": round(stalled, 3),
        "dispatches_per_flush": round(stats.get("dispatches", 0) / flushes, 2) if flushes else 0.0,
        "staging_bytes": up["bytes"] + down["bytes"],
        "kernels_cached": cache["size"],
        "readback_latency_s": {q: _percentile(latencies, float(q)) for q in ("0.5", "0.9", "0.99")}
        if latencies
        else {},
        "counters": counters,
    }


_GAUGE_KEYS = frozenset({"index", "memory_in_use", "live_buffers", "in_flight"})


def _percentile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

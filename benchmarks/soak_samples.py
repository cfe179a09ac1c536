"""What `gpud bench soak` samples of the daemon, and the summary of each series.

The daemon's process from /proc (resident memory, open file descriptors, threads), the daemon's own
account from its status message (the one `gpud stats --json` prints): device memory, live buffers,
tensor handles, sessions, residents, graphs, staging pools, queued work; and the sizes of its
bounded caches from a session's `stats()` (a session of the sampler's, opened after the status was
read and closed at once: it is not in the counts).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import gpud_client
from gpud.service import admin

# name -> (unit, what): the order of the plot's panels
SERIES: dict[str, tuple[str, str]] = {
    "rss_bytes": ("bytes", "daemon resident memory (VmRSS)"),
    "fds": ("count", "daemon open file descriptors"),
    "threads": ("count", "daemon threads"),
    "memory_in_use": ("bytes", "device memory gpud holds (all devices)"),
    "device_used_bytes": ("bytes", "device memory in use per the driver (total - free)"),
    "live_buffers": ("count", "device buffers alive"),
    "handles": ("count", "tensor handles of all sessions"),
    "session_graphs": ("count", "replay graphs of all sessions"),
    "sessions": ("count", "sessions"),
    "residents": ("count", "resident tensors"),
    "published_graphs": ("count", "published graphs"),
    "staging_bytes": ("bytes", "staging pools"),
    "kernels_cached": ("count", "compiled kernels cached"),
    "reused_bytes": ("bytes", "freed device memory kept for reuse (cuda)"),
    "bind_groups": ("count", "bind groups cached (webgpu)"),
    "cuda_graphs": ("count", "CUDA graphs of repeated launch segments cached (cuda)"),
    "replay_graph_execs": ("count", "replay graphs instantiated on the device (cuda)"),
    "modules": ("count", "CUDA modules loaded (cuda)"),
    "outbox_bytes": ("bytes", "replies waiting for peers"),
    "in_flight": ("count", "submissions in flight"),
    "ops_per_s": ("1/s", "ops executed per second (since the previous sample)"),
}


def process_sample(pid: int) -> dict[str, float]:
    """RSS, file descriptors and threads of process `pid`, from /proc."""
    fields: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key == "VmRSS":
            fields["rss_bytes"] = float(value.split()[0]) * 1024  # kB
        elif key == "Threads":
            fields["threads"] = float(value)
    fields["fds"] = float(len(os.listdir(f"/proc/{pid}/fd")))
    return fields


def status_sample(status: dict[str, Any]) -> dict[str, float]:
    """The daemon's own account, from its status message."""
    devices = status["devices"]
    sessions = status["sessions"]  # listed up to status.LIST_CAP, far more than a soak's
    used = [d["memory_total"] - d["memory_free"] for d in devices if d.get("memory_total") and d.get("memory_free")]
    out = {
        "memory_in_use": float(sum(d["memory_in_use"] for d in devices)),
        "live_buffers": float(sum(d["live_buffers"] for d in devices)),
        "staging_bytes": float(sum(d["staging_bytes"] for d in devices)),
        "kernels_cached": float(sum(d["kernels_cached"] for d in devices)),
        "in_flight": float(sum(d["in_flight"] for d in devices)),
        "handles": float(sum(s["handles"] for s in sessions)),
        "session_graphs": float(sum(s["graphs"] for s in sessions)),
        "sessions": float(status["session_count"]),
        "residents": float(status["resident_count"]),
        "published_graphs": float(status["graph_count"]),
        "outbox_bytes": float((status.get("outboxes") or {}).get("bytes_waiting", 0)),
        "ops": float(status["counters"].get("ops", 0)),
    }
    if len(used) == len(devices):
        out["device_used_bytes"] = float(sum(used))
    return out


async def _cache_sample(address: str) -> dict[str, float]:
    """The bounded caches' sizes, summed over the devices (those a backend has)."""
    async with gpud_client.connect(address) as gpu:
        devices = (await gpu.stats())["devices"]
    paths = {
        "reused_bytes": ("reused_memory", "bytes"),
        "bind_groups": ("bind_group_cache", "size"),
        "cuda_graphs": ("graph_cache", "size"),
        "replay_graph_execs": ("graph_cache", "replay_graphs"),
        "modules": ("modules",),
    }
    out: dict[str, float] = {}
    for name, path in paths.items():
        values = [_dig(d, path) for d in devices]
        if all(v is not None for v in values):
            out[name] = float(sum(v for v in values if v is not None))
    return out


def _dig(value: Any, path: tuple[str, ...]) -> float | None:
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return float(value) if isinstance(value, int | float) else None


def sample(pid: int, address: str, t: float, previous: dict[str, Any] | None, timeout: float = 10.0) -> dict[str, Any]:
    """One sample at `t` seconds into the run; `previous` gives the op rate."""
    row: dict[str, Any] = {"t_s": round(t, 3), **process_sample(pid)}
    try:
        row.update(status_sample(admin.query(address, timeout)))
    except admin.Unreachable as exc:
        row["status_error"] = str(exc)
        return row
    try:
        row.update(asyncio.run(_cache_sample(address)))
    except gpud_client.GpudError as exc:
        row["stats_error"] = f"{type(exc).__name__}: {exc}"
    if previous is not None and "ops" in previous and t > previous["t_s"]:
        row["ops_per_s"] = (row["ops"] - previous["ops"]) / (t - previous["t_s"])
    return row


def summary(samples: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per series: first, last, min, max, mean, and the least-squares slope per hour over the second
    half of the run (after the start-up's growth: what a leak looks like)."""
    out: dict[str, dict[str, float]] = {}
    if not samples:
        return out
    half = samples[-1]["t_s"] / 2
    for name in SERIES:
        points = [(s["t_s"], float(s[name])) for s in samples if name in s]
        if not points:
            continue
        values = [v for _, v in points]
        late = [(t, v) for t, v in points if t >= half]
        out[name] = {
            "first": values[0],
            "last": values[-1],
            "min": min(values),
            "max": max(values),
            "mean": sum(values) / len(values),
            "slope_per_hour_second_half": _slope(late) * 3600,
        }
    return out


def _slope(points: list[tuple[float, float]]) -> float:
    if len(points) < 2:
        return 0.0
    n = len(points)
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    return 0.0 if var == 0 else sum((t - mt) * (v - mv) for t, v in points) / var

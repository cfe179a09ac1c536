"""`gpud status` and `gpud stats`: ask a running daemon for its state over its normal socket.

One `{"t": "status"}` message, no session: whoever may open the socket may ask. The answer is
printed for people by default, or as JSON (`--json`) for scripts.
"""

from __future__ import annotations

import json
import os
from typing import Any

from gpud_client.status import Unreachable, query

__all__ = ["Unreachable", "query", "to_json"]


def to_json(status: dict[str, Any]) -> str:
    return json.dumps(status, indent=2, sort_keys=True)


def _per(total: int, count: int) -> str:
    return f"{total / count:.1f}" if count else "-"


def _bytes(n: Any) -> str:
    if n is None:
        return "?"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def _duration(seconds: float) -> str:
    seconds = float(seconds)
    if seconds < 120:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    return f"{days}d {hours}h {minutes}m" if days else f"{hours}h {minutes}m {secs}s"


def format_status(status: dict[str, Any]) -> str:
    health = status["health"]
    lines = [
        f"gpud {status['version']} ({status['backend']}), pid {status['pid']}, {status['state']}, "
        f"up {_duration(status['uptime_s'])}, at {status['address']}",
        "health: " + ("healthy" if health["healthy"] else "UNHEALTHY"),
    ]
    lines += [f"  {problem}" for problem in health["problems"]]
    if "workers" in status:  # a process-per-device front: what follows is its workers' together
        lines.append(f"workers: {len(status['workers'])} (a process per device)")
        lines += [
            f"  [{w['device']}] pid {w['pid']} at {w['address']}: {w['state']}, {w['session_count']} session(s)"
            for w in status["workers"]
        ]
    lines.append(f"devices: {len(status['devices'])}")
    for d in status["devices"]:
        total = d.get("memory_total")
        memory = f"{_bytes(d['memory_in_use'])} of {_bytes(total)}" if total else _bytes(d["memory_in_use"])
        stall = f", stalled {d['stalled_s']:.1f} s" if d.get("stalled_s") else ""
        lines.append(
            f"  [{d['index']}] {d['name']} ({d['backend']}): memory {memory} in use, {d['sessions']} session(s), "
            f"{d['pending_ops']} op(s) queued, {d['in_flight']} submission(s) in flight{stall}"
        )
    lines.append(f"sessions: {status['session_count']}")
    for s in status["sessions"]:
        lines.append(
            f"  {s['id']}  {s['client'] or '?'} (pid {s['pid']}) on device {s['device']}, connected "
            f"{_duration(s['connected_s'])}: {_bytes(s['memory_bytes'])}, {s['handles']} tensor(s), "
            f"{s['kernels']} kernel(s), {s['graphs']} graph(s), {s['ops']} op(s) done, "
            f"{s['requests_in_flight']} request(s) waiting"
        )
    _more(lines, status["session_count"], status["sessions"])
    lines.append(f"residents: {status['resident_count']}")
    for r in status["residents"]:
        shape = "x".join(str(n) for n in r["shape"]) or "scalar"
        lines.append(
            f"  {r['name']}  {r['dtype']}[{shape}] {_bytes(r['nbytes'])} on device {r['device']}, {r['mode']}, "
            f"published by {r['publisher']}, {r['refs']} reference(s)"
        )
    _more(lines, status["resident_count"], status["residents"])
    lines.append(f"published graphs: {status['graph_count']}")
    for g in status["graphs"]:
        lines.append(
            f"  {g['name']}  device {g['device']}, built by {g['builder']}, {_bytes(g['nbytes'])}, "
            f"{g['instances']} instance(s), {g['refs']} reference(s)"
        )
    _more(lines, status["graph_count"], status["graphs"])
    return "\n".join(lines)


def _more(lines: list[str], total: int, shown: list[Any]) -> None:
    if total > len(shown):
        lines.append(f"  ... and {total - len(shown)} more (see --json)")


def format_stats(status: dict[str, Any]) -> str:
    counters = status["counters"]
    names = ("messages", "batches", "ops", "sessions_opened", "sessions_ended", "bad_messages", "refused_stopping")
    lines = [f"gpud {status['version']} ({status['backend']}), up {_duration(status['uptime_s'])}"]
    lines.append("daemon: " + ", ".join(f"{name} {counters.get(name, 0)}" for name in names))
    lines.append(
        f"peers without a session: {counters.get('status_requests', 0)} status requests answered, "
        f"{counters.get('sessionless_dropped', 0)} messages dropped over budget, "
        f"{counters.get('sessionless_replies_dropped', 0)} replies dropped unread"
    )
    for d in status["devices"]:
        c = d["counters"]
        latency = d.get("readback_latency_s") or {}
        lat = ", ".join(f"p{float(q) * 100:g} {v * 1e3:.3f} ms" for q, v in latency.items()) or "no readbacks yet"
        lines += [
            f"device {d['index']} ({d['name']}, {d['backend']}):",
            f"  dispatches {c.get('dispatches', 0)}, flushes {c.get('flushes', 0)}, "
            f"{d['dispatches_per_flush']} dispatches per flush, submissions {c.get('submitted', 0)} "
            f"(completed {c.get('completed', 0)}, failed {c.get('failed_submissions', 0)}, "
            f"via the submit worker {c.get('worker_submits', 0)}), throttled waits {c.get('throttle_waits', 0)}",
            f"  staging pools: uploads {c['upload_staging_hits']} hits / {c['upload_staging_misses']} misses / "
            f"{c['upload_staging_waits']} waits, downloads {c['download_staging_hits']} hits / "
            f"{c['download_staging_misses']} misses / {c['download_staging_waits']} waits, "
            f"{_bytes(d['staging_bytes'])} held",
            f"  kernel cache: {d['kernels_cached']} kept, {c['kernel_cache_hits']} hits, "
            f"{c['kernel_cache_misses']} misses, {c['kernel_cache_evictions']} evictions; compiles "
            f"{c.get('compiles', 0)} (errors {c.get('compile_errors', 0)})",
            f"  graph replays {c.get('graph_replays', 0)}, graphs instantiated {c.get('graphs_instantiated', 0)}; "
            f"uploaded {_bytes(c.get('upload_bytes', 0))}, read back {_bytes(c.get('download_bytes', 0))}",
            f"  row-independent replays: {c.get('merged_launches', 0)} merged launches of "
            f"{c.get('merged_rows', 0)} rows ({_per(c.get('merged_rows', 0), c.get('merged_launches', 0))} rows "
            f"per launch), {c.get('row_launches', 0)} launched alone",
            f"  readback latency (copy encoded to completed, latest 1,024): {lat}",
        ]
        extra = {k: v for k, v in c.items() if k not in _SHOWN}
        if extra:
            lines.append("  backend: " + ", ".join(f"{k} {v}" for k, v in sorted(extra.items())))
    return "\n".join(lines)


_SHOWN = frozenset(
    {
        "dispatches",
        "flushes",
        "submitted",
        "completed",
        "failed_submissions",
        "worker_submits",
        "throttle_waits",
        "compiles",
        "compile_errors",
        "graph_replays",
        "graphs_instantiated",
        "merged_launches",
        "merged_rows",
        "row_launches",
        "upload_bytes",
        "download_bytes",
        "upload_staging_hits",
        "upload_staging_misses",
        "upload_staging_waits",
        "download_staging_hits",
        "download_staging_misses",
        "download_staging_waits",
        "kernel_cache_hits",
        "kernel_cache_misses",
        "kernel_cache_evictions",
    }
)


def environment_address() -> str:
    """The address `gpud status` asks: GPUD_ADDRESS, else the client's default (which finds /run/gpud)."""
    from gpud_client import default_address

    return os.environ.get("GPUD_ADDRESS") or default_address()

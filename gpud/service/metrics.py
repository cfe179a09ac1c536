"""Prometheus text endpoint (off by default: `metrics_address = "127.0.0.1:9464"` turns it on).

The same snapshot that answers `gpud status` becomes metric families here: daemon counters, and
per-device gauges and counters labelled `device`. The text is rendered by `prometheus-client` when it
is installed (`pip install 'gpud[metrics]'`), else by the small renderer below; either way it is
served by a tiny asyncio HTTP server on the daemon's own event loop, so a scrape reads the daemon's
state between two drains of the socket and never races it.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
Sample = tuple[dict[str, str], float]


class Family(NamedTuple):
    name: str  # without the `_total` of a counter: the renderers add it
    kind: str  # "counter" or "gauge"
    help: str
    samples: list[Sample]


# (snapshot key in a device's "counters", metric name, help)
_DEVICE_COUNTERS = (
    ("dispatches", "dispatches", "dispatches encoded"),
    ("flushes", "flushes", "pending command buffers submitted"),
    ("submitted", "submissions", "submissions numbered by the completion ledger"),
    ("completed", "completions", "submissions completed"),
    ("failed_submissions", "failed_submissions", "submissions the device refused"),
    ("worker_submits", "worker_submits", "submissions handed to the submit worker"),
    ("throttle_waits", "throttle_waits", "waits for a device with too many submissions in flight"),
    ("compiles", "compiles", "kernels compiled"),
    ("compile_errors", "compile_errors", "kernels that failed to compile"),
    ("kernel_cache_hits", "kernel_cache_hits", "compiled-kernel cache hits"),
    ("kernel_cache_misses", "kernel_cache_misses", "compiled-kernel cache misses"),
    ("kernel_cache_evictions", "kernel_cache_evictions", "compiled kernels evicted"),
    ("graph_replays", "graph_replays", "replay-graph launches"),
    ("graphs_instantiated", "graphs_instantiated", "replay-graph instances built"),
    ("upload_bytes", "upload_bytes", "bytes uploaded"),
    ("download_bytes", "download_bytes", "bytes read back"),
)
_DEVICE_GAUGES = (
    ("memory_in_use", "memory_in_use_bytes", "device memory held by gpud's tensors"),
    ("memory_total", "memory_total_bytes", "device memory in all"),
    ("live_buffers", "live_buffers", "device buffers held"),
    ("sessions", "sessions", "sessions whose default device this is"),
    ("pending_ops", "pending_ops", "ops encoded and not yet submitted"),
    ("in_flight", "submissions_in_flight", "submissions not yet completed"),
    ("stalled_s", "stalled_seconds", "seconds of pending work without a completion"),
    ("dispatches_per_flush", "dispatches_per_flush", "mean dispatches per flush"),
)
_DAEMON_COUNTERS = (
    ("messages", "messages", "messages received"),
    ("batches", "batches", "batches received"),
    ("ops", "ops", "ops received"),
    ("sessions_opened", "sessions_opened", "sessions opened"),
    ("sessions_ended", "sessions_ended", "sessions ended"),
    ("bad_messages", "bad_messages", "messages refused as malformed"),
    ("refused_stopping", "refused_while_stopping", "messages refused while the daemon drained"),
    ("status_requests", "status_requests", "status requests answered"),
    ("doorbells", "doorbells", "doorbells rung by ring clients that found the daemon asleep"),
    ("sessionless_dropped", "sessionless_dropped", "messages of peers without a session dropped over their budget"),
    ("sessionless_replies_dropped", "sessionless_replies_dropped", "replies to peers without a session dropped"),
)


def families(status: dict[str, Any]) -> list[Family]:
    """Metric families from a status snapshot (`Server.status()`)."""
    counters = status.get("counters", {})
    residents = status.get("residents", ())
    out = [
        Family("gpud_up", "gauge", "1 while the daemon serves", [({}, 1.0)]),
        Family(
            "gpud_info",
            "gauge",
            "version and backend of the daemon",
            [({"version": str(status.get("version", "")), "backend": str(status.get("backend", ""))}, 1.0)],
        ),
        Family("gpud_healthy", "gauge", "1 while work makes progress", [({}, float(status["health"]["healthy"]))]),
        Family("gpud_stopping", "gauge", "1 while the daemon drains", [({}, float(status.get("state") == "stopping"))]),
        Family("gpud_uptime_seconds", "gauge", "seconds since start", [({}, float(status.get("uptime_s", 0.0)))]),
        Family("gpud_sessions", "gauge", "connected sessions", [({}, float(status.get("session_count", 0)))]),
        Family("gpud_residents", "gauge", "published resident tensors", [({}, float(status.get("resident_count", 0)))]),
        Family(
            "gpud_resident_bytes",
            "gauge",
            "bytes of the resident tensors listed",
            [({}, float(sum(r.get("nbytes", 0) for r in residents)))],
        ),
        Family(
            "gpud_published_graphs", "gauge", "published replay graphs", [({}, float(status.get("graph_count", 0)))]
        ),
    ]
    for key, name, text in _DAEMON_COUNTERS:
        out.append(Family(f"gpud_{name}", "counter", text, [({}, float(counters.get(key, 0)))]))
    devices = status.get("devices", [])
    for key, name, text in _DEVICE_GAUGES:
        samples = [({"device": str(d["index"])}, float(d.get(key) or 0)) for d in devices]
        out.append(Family(f"gpud_device_{name}", "gauge", text, samples))
    for key, name, text in _DEVICE_COUNTERS:
        samples = [({"device": str(d["index"])}, float(d.get("counters", {}).get(key, 0))) for d in devices]
        out.append(Family(f"gpud_device_{name}", "counter", text, samples))
    for what in ("hits", "misses", "waits"):
        samples = [
            ({"device": str(d["index"]), "pool": pool}, float(d.get("counters", {}).get(f"{pool}_staging_{what}", 0)))
            for d in devices
            for pool in ("upload", "download")
        ]
        text = {"hits": "staging requests served by an idle buffer", "misses": "staging buffers made"}.get(
            what, "staging requests that waited for a full pool"
        )
        out.append(Family(f"gpud_device_staging_{what}", "counter", text, samples))
    latency = [
        ({"device": str(d["index"]), "quantile": q}, float(v))
        for d in devices
        for q, v in (d.get("readback_latency_s") or {}).items()
        if v is not None
    ]
    out.append(
        Family(
            "gpud_device_readback_latency_seconds",
            "gauge",
            "readback copy encoded to completed, quantiles of the latest 1024",
            latency,
        )
    )
    return out


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


def render_builtin(fams: Iterable[Family]) -> bytes:
    """The Prometheus text exposition format (0.0.4)."""
    lines: list[str] = []
    for fam in fams:
        name = fam.name + ("_total" if fam.kind == "counter" else "")
        text = fam.help.replace("\\", "\\\\").replace("\n", "\\n")
        lines.append(f"# HELP {name} {text}")
        lines.append(f"# TYPE {name} {fam.kind}")
        for labels, value in fam.samples:
            pairs = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
            lines.append(f"{name}{{{pairs}}} {_number(value)}" if pairs else f"{name} {_number(value)}")
    return ("\n".join(lines) + "\n").encode()


def render_prometheus_client(fams: Iterable[Family]) -> bytes:
    """The same text through prometheus-client (raises ImportError when it is not installed)."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    built: list[Any] = []
    for fam in fams:
        keys = sorted({k for labels, _ in fam.samples for k in labels})
        cls = CounterMetricFamily if fam.kind == "counter" else GaugeMetricFamily
        metric = cls(fam.name, fam.help, labels=keys)
        for labels, value in fam.samples:
            metric.add_metric([labels.get(k, "") for k in keys], value)
        built.append(metric)

    class _Snapshot:
        def collect(self) -> list[Any]:
            return built

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot())
    data: bytes = generate_latest(registry)
    return data


def renderer() -> tuple[str, Callable[[Iterable[Family]], bytes]]:
    """("prometheus-client", its renderer) when installed, else ("built-in", ours)."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        return "built-in", render_builtin
    return "prometheus-client", render_prometheus_client


def split_host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


class MetricsServer:
    """GET /metrics on `host:port`, answered from `snapshot()` on the event loop."""

    def __init__(self, address: str, snapshot: Callable[[], dict[str, Any]]) -> None:
        self.address = address
        self._snapshot = snapshot
        self.renderer_name, self._render = renderer()
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        host, port = split_host_port(self.address)
        try:
            self._server = await asyncio.start_server(self._client, host, port, limit=16 * 1024)
        except OSError as exc:
            raise OSError(f"metrics_address {self.address}: {exc.strerror or exc}") from None
        log.info("metrics: http://%s/metrics (%s renderer)", self.address, self.renderer_name)

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    def render(self) -> bytes:
        return self._render(families(self._snapshot()))

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(5):
                request = await reader.readline()
                while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
                    if len(line) > 8192:
                        break
            parts = request.split()
            if len(parts) >= 2 and parts[0] == b"GET" and parts[1].split(b"?")[0] in (b"/metrics", b"/"):
                status, body, kind = b"200 OK", self.render(), CONTENT_TYPE.encode()
            else:
                status, body, kind = b"404 Not Found", b"try /metrics\n", b"text/plain"
            head = b"HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
            writer.write(head % (status, kind, len(body)) + body)
            await writer.drain()
        except (TimeoutError, ConnectionError, ValueError, asyncio.LimitOverrunError):
            pass
        except Exception:  # a bug here must not take the daemon down
            log.exception("metrics: answering a scrape failed")
        finally:
            writer.close()

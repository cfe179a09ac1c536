"""Daemon settings, defined once: `Config`, each setting a field (declared with `setting`), loaded from
the TOML file's [gpud] table and the flags of `gpud serve` (`config_flags`), every value validated.
The shipped example file is rendered from the same fields (`config_example`)."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import os
import tomllib
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpud.service import config_checks as checks
from gpud.service.setting import MS, RATE, US, B, GiB, KiB, MiB, S, check_value, describe, setting
from gpud_protocol import Limits


class ConfigError(Exception):
    """A bad setting: one line naming the source (file or command line), the key, what was expected and found."""


def default_cache_dir() -> Path:
    """GPUD_CACHE_DIR, else /var/cache/gpud for root, else $XDG_CACHE_HOME/gpud (~/.cache/gpud)."""
    if cache := os.environ.get("GPUD_CACHE_DIR"):
        return Path(cache)
    if os.geteuid() == 0:
        return Path("/var/cache/gpud")
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpud"


SYSTEM_CONFIG = Path("/etc/gpud/gpud.toml")


def _default_address() -> str:
    """GPUD_ADDRESS, else ipc://$XDG_RUNTIME_DIR/gpud/gpud.sock, else (root, or no XDG_RUNTIME_DIR: a
    system service) ipc:///run/gpud/gpud.sock. Clients look for the per-user socket first, then this one."""
    if address := os.environ.get("GPUD_ADDRESS"):
        return address
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(runtime) if runtime and os.geteuid() != 0 else Path("/run")
    return f"ipc://{base / 'gpud' / 'gpud.sock'}"


def default_config_path(environ: Mapping[str, str] | None = None, euid: int | None = None) -> Path | None:
    """/etc/gpud/gpud.toml when it exists and the daemon runs as root or under systemd (INVOCATION_ID),
    else None (no file: every setting at its default, flags aside)."""
    environ = os.environ if environ is None else environ
    euid = os.geteuid() if euid is None else euid
    if (euid == 0 or environ.get("INVOCATION_ID")) and SYSTEM_CONFIG.is_file():
        return SYSTEM_CONFIG
    return None


_service = functools.partial(setting, section="service")
_coalescing = functools.partial(setting, section="coalescing")
_pools = functools.partial(setting, section="pools and caches")
_sessions = functools.partial(setting, section="sessions")
_operation = functools.partial(setting, section="service operation")


@dataclasses.dataclass(frozen=True)
class Config:
    """Every daemon setting. Build it with `load` or `from_values`, which validate; the constructor does not."""

    address: str = _service(
        help="ipc:// or tcp:// endpoint",
        factory=_default_address,
        check=checks.address,
        metavar="ADDRESS",
        example="ipc:///run/gpud/gpud.sock",
        default_doc="GPUD_ADDRESS, else ipc://$XDG_RUNTIME_DIR/gpud/gpud.sock (root: ipc:///run/gpud/gpud.sock)",
    )
    backend: str = _service("auto", "auto: cuda if a CUDA device exists", choices=("auto", "cuda", "webgpu", "fake"))
    devices: str | list[int] = _service("all", "GPU devices to serve", check=checks.devices, metavar="all|0,2")  # noqa: RUF009
    insecure_tcp: bool = _service(False, "allow tcp:// without CURVE (testing only)")
    curve_secret_key: str = _service("", "CURVE certificate file (zmq.auth) for tcp://; empty: none", metavar="FILE")
    event_loop: str = _service("auto", "auto: uvloop when installed", choices=("auto", "asyncio", "uvloop"))
    busy_poll_us: float = _service(0.0, "after a message, poll for the next before sleeping", min=0, max=1e6, unit=US)
    ring_bytes: int = _service(
        MiB, "each way of a session's shared-memory ring (ipc:// fast path; 0: off)", check=checks.ring_bytes, unit=B
    )
    ring_spin_us: float = _service(
        1000.0,
        "while ring sessions exist, poll their rings this long after a message before sleeping",
        min=0,
        max=1e6,
        unit=US,
    )
    trace: bool = _service(False, "stamp readback replies with daemon-side times (performance work)")
    max_sessions: int = _service(1024, "client sessions at once; more are refused", min=1)
    process_per_device: bool = _service(
        False,
        "with several devices, a worker process per device behind this socket (ipc:// only): each session "
        "uses one device, whose worker the client is sent to",
    )

    max_dispatches_per_flush: int = _coalescing(1024, "submit once this many dispatches are pending", min=1, max=65536)
    submission_target_s: float = _coalescing(
        1.0,
        "fewer dispatches per submission where they are slow, about this much device time each: health sees "
        "long work progress (0: count alone)",
        min=0,
        max=3600,
        unit=S,
    )
    flush_deadline_ms: float = _coalescing(
        2.0, "submit pending work once it has waited this long", above=0, max=1e4, unit=MS
    )
    max_submissions_in_flight: int = _coalescing(
        16, "new GPU work waits while the device is this far behind", min=1, max=1024
    )
    graph_cache_size: int = _coalescing(32, "cuda: graphs of repeated launch segments kept (0: never capture)", min=0)
    graph_min_launches: int = _coalescing(16, "cuda: shorter segments are launched one by one", min=1)
    graph_pdl: bool = _coalescing(
        True,
        "cuda (sm_90 and later): in a graph, each library kernel is launched while the one before it finishes "
        "(programmatic dependent launch)",
    )
    completion_spin_us: float = _coalescing(
        50.0, "cuda: poll a flush that a readback awaits this long before handing it off", min=0, max=1e6, unit=US
    )
    gil_switch_us: float = _coalescing(
        500.0,
        "how long a thread runs Python before another may (sys.setswitchinterval): a completion that another "
        "thread reports waits at most about this long for a busy loop thread",
        above=0,
        max=1e5,
        unit=US,
    )
    completion_poll_us: float = _coalescing(
        2000.0,
        "cuda: then poll it between the event loop's other work this long before the completion thread takes it",
        min=0,
        max=1e6,
        unit=US,
    )

    staging_pool_bytes: int = _pools(256 * MiB, "bound on host staging buffers (uploads, readbacks)", min=MiB, unit=B)
    reuse_memory_bytes: int = _pools(
        512 * MiB, "freed device memory kept for allocations of the same size (cuda)", min=0, unit=B
    )
    pool_idle_release_s: float = _pools(
        30.0, "staging buffers and kept device memory idle this long are released (0: kept)", min=0, unit=S
    )
    kernel_cache_size: int = _pools(256, "compiled kernels kept", min=1)
    bind_group_cache_size: int = _pools(8192, "webgpu: bind groups kept", min=1)
    cache_dir: Path = _pools(  # noqa: RUF009
        help="on-disk cache of compiled kernels",
        factory=default_cache_dir,
        metavar="DIR",
        example="/var/cache/gpud",
        default_doc="GPUD_CACHE_DIR, else $XDG_CACHE_HOME/gpud (root: /var/cache/gpud)",
    )

    lease_s: float = _sessions(5.0, "a session without a heartbeat this long is ended", min=0.1, max=3600, unit=S)
    session_memory_bytes: int = _sessions(8 * GiB, "device memory quota per session, per device", min=0, unit=B)
    session_max_requests: int = _sessions(4096, "awaited requests (readbacks, syncs, kernels) per session", min=1)
    session_max_handles: int = _sessions(65536, "open tensor handles per session", min=1)
    session_max_kernels: int = _sessions(1024, "registered kernels per session", min=1)
    session_max_failures: int = _sessions(64, "unacknowledged failed ops kept per session", min=1)
    session_max_graphs: int = _sessions(64, "replay graphs a session builds or opens", min=1)
    graph_instances: int = _sessions(8, "instances (input shapes) of one replay graph", min=1, max=1024)
    merge_replays: bool = _coalescing(
        True, "launch concurrent replays of a row-independent graph together (its rows=True instances)"
    )
    merge_wait_us: float = _coalescing(
        2000.0,
        "after a merged launch completed, wait this long at most for its sessions' next replays (0: never)",
        min=0,
        max=1e6,
        unit=US,
    )
    session_window: int = _sessions(64, "batches a client may send before the daemon confirms them", min=1)
    session_reply_bytes: int = _sessions(2 * GiB, "reply bytes a session may have waiting to be sent", min=MiB, unit=B)
    sessionless_rate: float = _sessions(
        100.0, "messages from one peer without a session (status, garbage); more are dropped", above=0, unit=RATE
    )
    sessionless_total_rate: float = _sessions(
        1000.0, "messages from all peers without a session (beats, hellos aside); more are dropped", above=0, unit=RATE
    )
    sessionless_reply_bytes: int = _sessions(
        MiB, "reply bytes waiting for one peer without a session; more replies are dropped", min=64 * KiB, unit=B
    )
    resident_max_count: int = _sessions(4096, "published resident tensors, all sessions together", min=0)
    resident_max_bytes: int = _sessions(64 * GiB, "memory of resident tensors, all sessions together", min=0, unit=B)

    drain_timeout_s: float = _operation(10.0, "on shutdown, wait this long for pending work", min=0, unit=S)
    health_stall_s: float = _operation(30.0, "pending work with no completion this long: unhealthy", above=0, unit=S)
    metrics_address: str = _operation(
        "", "Prometheus endpoint host:port; empty: none", check=checks.host_port, metavar="HOST:PORT"
    )

    limits: Limits = setting(help="hard bounds on client messages", factory=Limits, section="limits", cli=False)  # noqa: RUF009

    @classmethod
    def from_values(cls, values: Mapping[str, Any], source: str = "config") -> Config:
        """Validate a [gpud] table's worth of values (missing keys keep their defaults); ConfigError if wrong."""
        return cls._build(_validate(values, source))

    @classmethod
    def load(cls, path: Path | None, **overrides: Any) -> Config:
        """The TOML file's [gpud] table (if a path is given), then the overrides that are not None, all validated."""
        base = _validate(_read(path), str(path)) if path is not None else {}
        given = _validate({k: v for k, v in overrides.items() if v is not None}, "command line")
        return cls._build(base | given, base.get("limits", {}))

    @classmethod
    def _build(cls, values: dict[str, Any], base_limits: Mapping[str, int] | None = None) -> Config:
        if "limits" in values:  # a [gpud.limits] table sets some limits; overrides add to the file's
            values = values | {"limits": Limits(**{**(base_limits or {}), **values["limits"]})}
        return cls(**values)


@functools.cache
def config_fields() -> dict[str, tuple[dataclasses.Field[Any], Any]]:
    """Every setting, in declaration order: its name -> (its field, whose metadata `setting` made; its type)."""
    hints = typing.get_type_hints(Config)
    return {f.name: (f, hints[f.name]) for f in dataclasses.fields(Config)}


def _unknown(source: str, key: str, known: Any, where: str) -> ConfigError:
    close = difflib.get_close_matches(key, list(known), n=1)
    return ConfigError(
        f'{source}: unknown key "{key}" in {where}' + (f' (did you mean "{close[0]}"?)' if close else "")
    )


def _validate(values: Mapping[str, Any], source: str) -> dict[str, Any]:
    fields, out = config_fields(), {}
    for key, value in values.items():
        if key not in fields:
            raise _unknown(source, key, fields, "[gpud]")
        try:
            field, tp = fields[key]
            out[key] = _limits(value, source) if key == "limits" else check_value(tp, field.metadata, value)
        except ValueError as exc:
            raise ConfigError(f"{source}: {key}: {exc}") from None
    return out


def _limits(value: Any, source: str) -> dict[str, int]:
    value = value.as_dict() if isinstance(value, Limits) else value
    if not isinstance(value, Mapping):
        raise ValueError(f"expected a [gpud.limits] table, got {describe(value)}")
    known, out = {f.name for f in dataclasses.fields(Limits)}, {}
    for key, v in value.items():
        if key not in known:
            raise _unknown(source, key, known, "[gpud.limits]")
        try:
            out[key] = check_value(int, {"min": 1}, v)
        except ValueError as exc:
            raise ConfigError(f"{source}: limits.{key}: {exc}") from None
    return out


def _read(path: Path) -> dict[str, Any]:
    """The [gpud] table of a TOML file, which must hold nothing else."""
    try:
        doc = tomllib.loads(Path(path).read_bytes().decode())
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    for key in doc:
        if key in config_fields():
            raise ConfigError(f'{path}: "{key}" is outside the [gpud] table: put it under [gpud]')
        if key != "gpud":
            raise _unknown(str(path), key, ["gpud"], "the top level, which may hold only a [gpud] table")
    if not isinstance(table := doc.get("gpud", {}), dict):
        raise ConfigError(f"{path}: gpud: expected a [gpud] table, got {describe(table)}")
    return table


def check(path: Path | str) -> str:
    """Validate a config file (ConfigError if wrong); a one-line summary for `gpud serve --check-config`."""
    table = _read(Path(path))
    Config.from_values(table, str(path))
    given = [k for k in table if k != "limits"] + [f"limits.{k}" for k in table.get("limits", {})]
    total = len(config_fields()) - 1 + len(dataclasses.fields(Limits))
    return f"{path}: valid; sets {len(given)} of {total} settings, the others are defaults" + (
        f": {', '.join(given)}" if given else ""
    )

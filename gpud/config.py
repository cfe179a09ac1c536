"""Daemon configuration: defaults, an optional TOML file, then command-line overrides."""

from __future__ import annotations

import dataclasses
import os
import tomllib
from pathlib import Path
from typing import Any

from gpud_client import default_address
from gpud_protocol import Limits


def default_cache_dir() -> Path:
    if cache := os.environ.get("GPUD_CACHE_DIR"):
        return Path(cache)
    if os.geteuid() == 0:
        return Path("/var/cache/gpud")
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gpud"


@dataclasses.dataclass
class Config:
    address: str = dataclasses.field(default_factory=default_address)
    backend: str = "auto"  # auto | webgpu | cuda
    device: int = 0
    insecure_tcp: bool = False  # allow plain tcp:// without CURVE (testing only)
    curve_secret_key: str = ""  # z85 server secret key file, enables CURVE on tcp://
    # coalescing
    max_dispatches_per_flush: int = 1024
    flush_deadline_ms: float = 2.0
    max_submissions_in_flight: int = 16  # stop reading new messages while the device is this far behind
    graph_cache_size: int = 32  # cuda: replay graphs of repeated launch segments (0: never capture)
    graph_min_launches: int = 16  # cuda: shorter segments are launched one by one
    completion_spin_us: float = 50.0  # cuda: poll a flush that a readback awaits this long before handing it off
    event_loop: str = "auto"  # auto (uvloop when installed) | asyncio | uvloop
    busy_poll_us: float = 0.0  # after each message, poll this long for the next before sleeping
    trace: bool = False  # stamp readback replies with daemon-side times (performance work)
    # pools and caches
    staging_pool_bytes: int = 256 << 20
    kernel_cache_size: int = 256
    bind_group_cache_size: int = 8192
    cache_dir: Path = dataclasses.field(default_factory=default_cache_dir)
    # sessions
    lease_s: float = 5.0
    session_memory_bytes: int = 8 << 30
    session_max_requests: int = 4096  # readbacks/syncs/kernels in flight per session
    session_max_handles: int = 65536  # open tensor handles per session
    session_max_kernels: int = 1024  # registered kernels per session
    limits: Limits = dataclasses.field(default_factory=Limits)

    @classmethod
    def load(cls, path: Path | None, **overrides: Any) -> Config:
        values: dict[str, Any] = {}
        if path is not None:
            with open(path, "rb") as f:
                values.update(tomllib.load(f).get("gpud", {}))
        values.update({k: v for k, v in overrides.items() if v is not None})
        known = {f.name for f in dataclasses.fields(cls)}
        if unknown := set(values) - known:
            raise ValueError(f"unknown config keys: {sorted(unknown)}")
        if isinstance(values.get("limits"), dict):
            values["limits"] = Limits(**values["limits"])
        if "cache_dir" in values:
            values["cache_dir"] = Path(values["cache_dir"])
        return cls(**values)

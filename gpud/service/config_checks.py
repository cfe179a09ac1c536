"""The checks of the settings' values that a kind and a range do not say (`gpud.service.config`)."""

from __future__ import annotations

from typing import Any

from gpud.service.setting import KiB, MiB, describe, toml_text


def devices(value: Any) -> str | list[int]:
    if value == "all":
        return "all"
    if not isinstance(value, list | tuple) or not value:
        raise ValueError(f'expected "all" or a non-empty list of device indices, got {describe(value)}')
    for d in value:
        if isinstance(d, bool) or not isinstance(d, int) or d < 0:
            raise ValueError(f"expected device indices (integers >= 0), got {describe(d)}")
    if len(set(value)) != len(value):
        raise ValueError(f"expected distinct device indices, got {toml_text(value)}")
    return list(value)


def ring_bytes(value: int) -> int:
    if (value and not 4 * KiB <= value <= 2 * MiB) or value % 8:
        raise ValueError("0 (off), or 4 KiB to 2 MiB in multiples of 8 (a message past half of it goes by ZeroMQ)")
    return value


def address(value: str) -> str:
    if not value.startswith(("ipc://", "tcp://")) or len(value) <= len("ipc://"):
        raise ValueError(f"expected an ipc:// or tcp:// endpoint, got {describe(value)}")
    return value


def host_port(value: str) -> str:
    host, _, port = value.rpartition(":")
    if value and not (host and port.isdigit() and 0 < int(port) < 65536):
        raise ValueError(f'expected "" or "host:port", got {describe(value)}')
    return value

"""A running daemon's status, asked over its normal socket: one `{"t": "status"}` message, no session
(whoever may open the socket may ask). `gpud status` prints it (gpud.service.admin); benchmarks and the
workloads read devices and memory from it (a process-per-device front answers for all its workers)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgpack
import zmq

import gpud_protocol as proto

MAX_STATUS_BYTES = 64 << 20


class Unreachable(RuntimeError):
    """No daemon answered at the address."""


def query(address: str, timeout: float = 3.0) -> dict[str, Any]:
    """The daemon's status snapshot (see `gpud.service.status.snapshot`)."""
    if address.startswith("ipc://") and not Path(address[len("ipc://") :]).exists():
        raise Unreachable(f"no daemon at {address}: the socket does not exist")
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(address)
        sock.send(proto.pack({"t": "status"}))
        if not sock.poll(int(timeout * 1000)):
            raise Unreachable(f"no answer from {address} within {timeout:g} s")
        frames = sock.recv_multipart()
        header = _unpack(frames[0])
    except zmq.ZMQError as exc:
        raise Unreachable(f"{address}: {exc}") from None
    finally:
        sock.close(linger=0)
        ctx.term()
    if header.get("t") == "error":
        raise Unreachable(f"{address} answered with an error: {header.get('msg')} (an older gpud?)")
    if header.get("t") != "status":
        raise Unreachable(f"{address} answered {header.get('t')!r}, not a status")
    status: dict[str, Any] = _plain(header)
    return status


def _unpack(frame: bytes) -> dict[str, Any]:
    """A status reply: bounded, like every message, but with room for many counters and sessions."""
    if len(frame) > MAX_STATUS_BYTES:
        raise Unreachable(f"a status reply of {len(frame)} bytes is larger than {MAX_STATUS_BYTES}")
    try:
        header = msgpack.unpackb(
            frame,
            raw=False,
            strict_map_key=True,
            max_str_len=1 << 20,
            max_bin_len=0,
            max_ext_len=0,
            max_array_len=1 << 16,
            max_map_len=4096,
        )
    except Exception as exc:  # msgpack raises many types
        raise Unreachable(f"an undecodable answer ({type(exc).__name__}): not a gpud?") from None
    if type(header) is not dict:
        raise Unreachable("an answer that is not a map: not a gpud?")
    return header


def _plain(value: Any) -> Any:
    """msgpack's tuples as lists, for JSON and for the formatters."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def memory_in_use(address: str, timeout: float = 10.0) -> int:
    """Every device's memory in use, in bytes."""
    return sum(int(d["memory_in_use"]) for d in query(address, timeout)["devices"])


def device_count(address: str, timeout: float = 10.0) -> int:
    """The devices the daemon serves (a session's welcome under a process per device lists only its own)."""
    return len(query(address, timeout)["devices"])

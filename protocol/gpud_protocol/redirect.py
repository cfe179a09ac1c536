"""The front's answer to a hello when the daemon runs a process per device: say hello at a worker instead.

    {"t": "redirect", "address": "ipc://...", "device": int}

A daemon started with `process_per_device` and several devices is a front: it serves no session
itself, and answers each hello with the address of the worker process serving the device the
client asked for (or the least loaded one). The client follows it once: a redirect from the
worker, or any other time, is a protocol error. The client checks it like any daemon message.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from gpud_protocol.errors import ErrorCode, ProtocolViolation
from gpud_protocol.limits import Limits
from gpud_protocol.wire import describe, pack

MAX_ADDRESS_LEN = 6 + 107  # "ipc://" and the longest path a unix socket allows
SCHEME = "ipc://"  # workers listen on ipc:// only (tcp:// is served by one process)


class Redirect(NamedTuple):
    address: str  # the worker's socket
    device: int  # the device it serves, as the front numbers them


def encode_redirect(address: str, device: int) -> bytes:
    return pack({"t": "redirect", "address": address, "device": device})


def decode_redirect(header: dict[str, Any], payload: Sequence[Any], limits: Limits) -> Redirect:
    """A redirect's fields, checked (ProtocolViolation if wrong)."""
    address, device = header.get("address"), header.get("device")
    if payload:
        raise ProtocolViolation(ErrorCode.PROTOCOL, "a redirect carries no frames")
    if type(address) is not str or not address.startswith(SCHEME) or len(address) > MAX_ADDRESS_LEN:
        raise ProtocolViolation(
            ErrorCode.PROTOCOL, f"a redirect's address must be an ipc:// address, got {describe(address)}"
        )
    if "\x00" in address or len(address) == len(SCHEME):
        raise ProtocolViolation(ErrorCode.PROTOCOL, "a redirect's address names no path")
    if type(device) is not int or not 0 <= device < limits.max_devices:
        raise ProtocolViolation(
            ErrorCode.PROTOCOL, f"a redirect's device must be a device index, got {describe(device)}"
        )
    return Redirect(address, device)

"""Exceptions raised by the client: one class per daemon error code (from gpud_protocol), and
DaemonLost for a daemon that went away or never was there."""

from __future__ import annotations

from gpud_protocol.errors import (
    AlreadyExists,
    Busy,
    CompileError,
    DeviceLost,
    GpudError,
    InternalError,
    InvalidArgument,
    NotFound,
    OutOfMemory,
    PermissionDenied,
    ProtocolError,
    SessionLost,
    from_code,
)


class DaemonLost(GpudError):
    """The daemon did not answer, went away, or nothing listens at the address. Connect again to go on."""


__all__ = [
    "AlreadyExists",
    "Busy",
    "CompileError",
    "DaemonLost",
    "DeviceLost",
    "GpudError",
    "InternalError",
    "InvalidArgument",
    "NotFound",
    "OutOfMemory",
    "PermissionDenied",
    "ProtocolError",
    "SessionLost",
    "from_code",
]

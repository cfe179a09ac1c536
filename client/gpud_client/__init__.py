"""Async client for gpud. Needs anyio, pyzmq and numpy; no GPU packages."""

from gpud_client.client import Client, Kernel, Scalar, Tensor, Trace, connect, default_address, f32, i32, u32
from gpud_client.errors import (
    AlreadyExists,
    Busy,
    CompileError,
    DaemonLost,
    DeviceLost,
    GpudError,
    InternalError,
    InvalidArgument,
    NotFound,
    OutOfMemory,
    PermissionDenied,
    ProtocolError,
    SessionError,
)

__version__ = "0.1.0"

__all__ = [
    "AlreadyExists",
    "Busy",
    "Client",
    "CompileError",
    "DaemonLost",
    "DeviceLost",
    "GpudError",
    "InternalError",
    "InvalidArgument",
    "Kernel",
    "NotFound",
    "OutOfMemory",
    "PermissionDenied",
    "ProtocolError",
    "Scalar",
    "SessionError",
    "Tensor",
    "Trace",
    "connect",
    "default_address",
    "f32",
    "i32",
    "u32",
]

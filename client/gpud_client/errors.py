"""Exceptions raised by the client; each daemon error code has its own class."""

from __future__ import annotations

from gpud_protocol import ErrorCode


class GpudError(Exception):
    """Base class. `seq` and `op` name the op that failed, when known."""

    code: ErrorCode = ErrorCode.INTERNAL

    def __init__(self, message: str, *, seq: int | None = None, op: str | None = None) -> None:
        where = f"{op} (op #{seq}) failed: " if op is not None else ""
        super().__init__(where + message)
        self.message = message
        self.seq = seq
        self.op = op


class ProtocolError(GpudError):
    code = ErrorCode.PROTOCOL


class InvalidArgument(GpudError):
    code = ErrorCode.INVALID_ARGUMENT


class NotFound(GpudError):
    code = ErrorCode.NOT_FOUND


class CompileError(GpudError):
    """The kernel did not compile; the message holds the compiler's log."""

    code = ErrorCode.COMPILE


class OutOfMemory(GpudError):
    code = ErrorCode.OUT_OF_MEMORY


class Busy(GpudError):
    code = ErrorCode.BUSY


class PermissionDenied(GpudError):
    code = ErrorCode.PERMISSION_DENIED


class DeviceLost(GpudError):
    code = ErrorCode.DEVICE_LOST


class InternalError(GpudError):
    code = ErrorCode.INTERNAL


class SessionError(GpudError):
    code = ErrorCode.SESSION


class AlreadyExists(GpudError):
    code = ErrorCode.ALREADY_EXISTS


class DaemonLost(GpudError):
    """The daemon did not answer, went away, or never was there. Connect again to go on."""


_BY_CODE: dict[int, type[GpudError]] = {
    cls.code: cls
    for cls in (
        ProtocolError,
        InvalidArgument,
        NotFound,
        CompileError,
        OutOfMemory,
        Busy,
        PermissionDenied,
        DeviceLost,
        InternalError,
        SessionError,
        AlreadyExists,
    )
}


def from_code(code: int, message: str, *, seq: int | None = None, op: str | None = None) -> GpudError:
    return _BY_CODE.get(code, InternalError)(message, seq=seq, op=op)

"""Error codes, and the exceptions that carry them, shared by the daemon and the client."""

from __future__ import annotations

import enum


class ErrorCode(enum.IntEnum):
    PROTOCOL = 1  # malformed or unknown message
    INVALID_ARGUMENT = 2  # well-formed op with bad values (dtype, shape, grid, args)
    NOT_FOUND = 3  # unknown handle or resident name
    COMPILE = 4  # kernel failed to compile; message holds the compiler log
    OUT_OF_MEMORY = 5  # device memory or session quota exhausted
    BUSY = 6  # back-pressure: too much work in flight for this session
    PERMISSION_DENIED = 7  # e.g. writing a read-only resident tensor
    DEVICE_LOST = 8  # the GPU context is gone; the daemon exits
    INTERNAL = 9  # a bug in gpud
    SESSION = 10  # no session, or the session ended (lease expired, too many unread replies...)
    ALREADY_EXISTS = 11  # resident name taken


class ProtocolViolation(Exception):
    """An op or message broke the protocol; `seq` is None when it cannot be attributed."""

    def __init__(self, code: ErrorCode, message: str, seq: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.seq = seq


class GpudError(Exception):
    """Base class. `seq` and `op` name the op that failed, when known (`op` alone: a call the client
    refused before anything was sent)."""

    code: ErrorCode = ErrorCode.INTERNAL

    def __init__(self, message: str, *, seq: int | None = None, op: str | None = None) -> None:
        where = "" if op is None else f"{op}: " if seq is None else f"{op} (op #{seq}) failed: "
        super().__init__(where + message)
        self.message = message
        self.seq = seq
        self.op = op


class ProtocolError(GpudError):
    """A message or op broke the protocol (malformed, unknown opcode, wrong field types)."""

    code = ErrorCode.PROTOCOL


class InvalidArgument(GpudError):
    """A well-formed op with bad values: dtype, shape, grid, or arguments that do not match the kernel."""

    code = ErrorCode.INVALID_ARGUMENT


class NotFound(GpudError):
    """An unknown or freed handle, an unknown resident name or graph."""

    code = ErrorCode.NOT_FOUND


class CompileError(GpudError):
    """The kernel did not compile; the message holds the compiler's log."""

    code = ErrorCode.COMPILE


class OutOfMemory(GpudError):
    """Device memory, a session quota or a daemon-wide bound (residents, handles, kernels) is exhausted."""

    code = ErrorCode.OUT_OF_MEMORY


class Busy(GpudError):
    """Back-pressure: too many requests, unconfirmed batches or unread reply bytes in flight."""

    code = ErrorCode.BUSY


class PermissionDenied(GpudError):
    """Writing a read-only resident tensor, or unpublishing a name this session may not remove."""

    code = ErrorCode.PERMISSION_DENIED


class DeviceLost(GpudError):
    """The GPU context is gone (a sticky CUDA error, a lost WebGPU device); the daemon exits and restarts."""

    code = ErrorCode.DEVICE_LOST


class InternalError(GpudError):
    """A bug in gpud; the op named failed, the daemon goes on serving."""

    code = ErrorCode.INTERNAL


class SessionLost(GpudError):
    """The daemon ended this session (its lease expired, or it did not read its replies), or never had one.
    Its private tensors are freed; connect again to go on."""

    code = ErrorCode.SESSION


class AlreadyExists(GpudError):
    """A resident tensor or graph of that name exists."""

    code = ErrorCode.ALREADY_EXISTS


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
        SessionLost,
        AlreadyExists,
    )
}


def from_code(code: int, message: str, *, seq: int | None = None, op: str | None = None) -> GpudError:
    return _BY_CODE.get(code, InternalError)(message, seq=seq, op=op)

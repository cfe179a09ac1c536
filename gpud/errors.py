"""Typed errors raised inside the daemon; each maps to one wire ErrorCode."""

from __future__ import annotations

from gpud_protocol import ErrorCode


class GpudError(Exception):
    code = ErrorCode.INTERNAL


class InvalidArgument(GpudError):
    code = ErrorCode.INVALID_ARGUMENT


class NotFound(GpudError):
    code = ErrorCode.NOT_FOUND


class CompileError(GpudError):
    code = ErrorCode.COMPILE


class OutOfMemory(GpudError):
    code = ErrorCode.OUT_OF_MEMORY


class Busy(GpudError):
    code = ErrorCode.BUSY


class PermissionDenied(GpudError):
    code = ErrorCode.PERMISSION_DENIED


class AlreadyExists(GpudError):
    code = ErrorCode.ALREADY_EXISTS


class DeviceLost(GpudError):
    """The GPU context is unusable; the daemon fails everything pending and exits non-zero."""

    code = ErrorCode.DEVICE_LOST

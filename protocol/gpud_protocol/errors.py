"""Error codes shared by the daemon and the client."""

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
    SESSION = 10  # no session, or the session ended (lease expired)
    ALREADY_EXISTS = 11  # resident name taken


class ProtocolViolation(Exception):
    """An op or message broke the protocol; `seq` is None when it cannot be attributed."""

    def __init__(self, code: ErrorCode, message: str, seq: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.seq = seq

"""The msgpack primitives both directions share: packing, the bounded header unpacker, and the checks
and descriptions of wire values that never recurse into them (a list nested a thousand deep would).
"""

from __future__ import annotations

import math
import struct
from typing import Any

import msgpack

from gpud_protocol.errors import ErrorCode, ProtocolViolation
from gpud_protocol.limits import Limits

_F32 = struct.Struct("<f")


def describe(value: object) -> str:
    """A short description of a value from the wire, without recursing into it."""
    if value is None:
        return "nil"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        text = str(value)
        return text if len(text) <= 24 else text[:10] + "..." + text[-6:]
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return repr(value[:40] + ("..." if len(value) > 40 else ""))
    if isinstance(value, tuple | list):
        return f"a list of {len(value)}"
    if isinstance(value, dict):
        return f"a map of {len(value)}"
    return f"a {type(value).__name__}"


def bad(message: str) -> ProtocolViolation:
    return ProtocolViolation(ErrorCode.INVALID_ARGUMENT, message)


def is_int(value: object) -> bool:
    return type(value) is int


def f32_fits(value: float) -> bool:
    """True if `value` is representable as a 32-bit float (infinities and NaN included)."""
    if not math.isfinite(value):
        return True
    try:
        _F32.pack(value)
    except OverflowError:
        return False
    return True


_packer = msgpack.Packer(use_bin_type=True)


def pack(value: Any) -> bytes:
    packed: bytes = _packer.pack(value)
    return packed


def unpack_header(frame: Any, limits: Limits) -> dict[str, Any]:
    if len(frame) > limits.max_header_bytes:
        raise ProtocolViolation(ErrorCode.PROTOCOL, f"header of {len(frame)} bytes is too large")
    try:
        header = msgpack.unpackb(
            frame,
            raw=False,
            strict_map_key=True,
            use_list=False,  # arrays decode as tuples: cheaper, hashable, ignored by the garbage collector
            max_str_len=max(limits.max_source_bytes, limits.max_name_len),
            max_bin_len=0,
            max_ext_len=0,
            max_array_len=max(limits.max_ops_per_batch, limits.max_args, limits.max_ndim, 8),
            max_map_len=64,
        )
    except Exception as exc:  # msgpack raises many types: ValueError, ExtraData, FormatError, RecursionError...
        raise ProtocolViolation(ErrorCode.PROTOCOL, f"undecodable header: {type(exc).__name__}") from None
    if type(header) is not dict or type(header.get("t")) is not str:
        raise ProtocolViolation(ErrorCode.PROTOCOL, "header must be a map with a string 't'")
    return header

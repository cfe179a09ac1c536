"""What the daemon sends a client (replies, parts, receipts, errors, pong), and the client's decoder."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpud_protocol.errors import ErrorCode
from gpud_protocol.limits import Limits
from gpud_protocol.wire import pack, unpack_header

PONG = pack({"t": "pong"})


def encode_reply(seq: int, **fields: Any) -> bytes:
    return pack({"t": "reply", "seq": seq, "ok": True, **fields})


def encode_part(seq: int, index: int) -> bytes:
    return pack({"t": "part", "seq": seq, "i": index})


def encode_receipt(number: int) -> bytes:
    return pack({"t": "receipt", "b": number})


def encode_error_reply(seq: int, code: ErrorCode, message: str, failed_seq: int, op: str) -> bytes:
    return pack({"t": "reply", "seq": seq, "ok": False, "err": [int(code), message, failed_seq, op]})


def encode_error(code: ErrorCode, message: str) -> bytes:
    return pack({"t": "error", "code": int(code), "msg": message})


def decode_server_message(frames: Sequence[Any], limits: Limits) -> tuple[dict[str, Any], list[Any]]:
    """A daemon message on the client, bounded like everything else: (header, payload frames)."""
    first = frames[0]
    header = unpack_header(first.buffer if hasattr(first, "buffer") else first, limits)
    return header, list(frames[1:])

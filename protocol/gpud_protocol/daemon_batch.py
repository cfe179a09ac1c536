"""A batch header as the client encodes it (`client_encode.encode_batch`), read op by op without
decoding the body of a dispatch: the body (everything after the seq) stays bytes, the key under which
a session's memo keeps it decoded and checked (`memo`). A repeated dispatch then costs a byte
comparison instead of building and comparing its nested tuples, and is looked up as it is read: it
leaves here as `Memoized(seq, entry)` (a miss as a `Body`, decoded by the caller). A replay's body is
kept the same way, keyed by (opcode, body): it leaves as a `ReplayBody` with the memo's entry, if
any, whose fields the caller takes as checked but for the frame, which each message's frames decide.

Only the client's own layout is read here (the keys in its order, each op an array). Anything else,
a message this reader cannot vouch for included, raises `NotCanonical`, and the caller decodes the
message the general way (`wire.unpack_header`), which gives the same ops for whatever both can read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import msgpack

from gpud_protocol.limits import Limits
from gpud_protocol.memo import DispatchEntry, DispatchMemo, Memoized
from gpud_protocol.op_table import Opcode
from gpud_protocol.wire import pack

BATCH_PREFIX = b"\x86" + pack("t") + pack("batch") + pack("ops")  # a map of 6, as `encode_batch` begins
_TAIL_KEYS = ("nf", "ack", "b", "rc")  # after "t" and "ops", in the client's order
_MAX_FIELDS = 16  # more than any op has: a longer op is left to the general decoder
_DISPATCH_FIELDS = 4  # kernel, grid, args, writes
# graph, frame, shapes, scalars, binds (and steps, chain): a replay's fields, kept in the memo by its body too
_REPLAY_FIELDS = {int(Opcode.REPLAY): 5, int(Opcode.LAUNCH): 5, int(Opcode.REPLAY_STEPS): 7}


class NotCanonical(Exception):
    """Not the client's layout (or not readable here): decode the message the general way."""


class ReplayBody(NamedTuple):
    """A replay (or launch, or steps) read by `read_batch`: its opcode, seq and body's bytes, and the
    memo's entry for them (its checked fields but the frame, which the message's frames decide), if any."""

    code: int
    seq: int
    body: bytes
    entry: DispatchEntry | None

    def unpacked(self, limits: Limits) -> tuple[Any, ...]:
        """The op as the general decoder sees it: (opcode, seq, *fields)."""
        unpacker = _unpacker(limits, len(self.body))
        unpacker.feed(self.body)
        try:
            fields = [unpacker.unpack() for _ in range(_REPLAY_FIELDS[self.code])]
        except Exception:  # over a limit the general decoder enforces on the whole header
            raise NotCanonical from None
        return (self.code, self.seq, *fields)


class Body(NamedTuple):
    """A dispatch as read: its seq and its body's bytes, decoded only where the memo lacks them."""

    seq: int
    body: bytes

    def unpacked(self, limits: Limits) -> tuple[Any, ...]:
        """The op as the general decoder sees it: (opcode, seq, *fields)."""
        unpacker = _unpacker(limits, len(self.body))
        unpacker.feed(self.body)
        try:
            fields = [unpacker.unpack() for _ in range(_DISPATCH_FIELDS)]
        except Exception:  # over a limit the general decoder enforces on the whole header
            raise NotCanonical from None
        return (int(Opcode.DISPATCH), self.seq, *fields)


def read_batch(frame: Any, limits: Limits, memo: DispatchMemo | None = None) -> dict[str, Any]:
    """The header of a batch in the client's layout: "ops" holds each op as a tuple, a dispatch as
    `Memoized` where `memo` holds its body, else as a `Body`; the other keys as they came."""
    if len(frame) > limits.max_header_bytes or bytes(frame[: len(BATCH_PREFIX)]) != BATCH_PREFIX:
        raise NotCanonical
    data = bytes(frame)[len(BATCH_PREFIX) :]
    unpacker = _unpacker(limits, len(data))
    unpacker.feed(data)
    try:
        ops = _read_ops(unpacker, data, limits, None if memo is None else memo.get)
        header: dict[str, Any] = {"t": "batch", "ops": ops}
        for key in _TAIL_KEYS:
            if unpacker.unpack() != key:
                raise NotCanonical
            header[key] = unpacker.unpack()
        if unpacker.tell() != len(data):
            raise NotCanonical
    except NotCanonical:
        raise
    except Exception:  # malformed, or over a limit: the general decoder says which
        raise NotCanonical from None
    return header


def _read_ops(
    unpacker: msgpack.Unpacker, data: bytes, limits: Limits, find: Callable[[Any], DispatchEntry | None] | None
) -> tuple[Any, ...]:
    count = unpacker.read_array_header()
    if count > limits.max_ops_per_batch:
        raise NotCanonical
    ops: list[Any] = []
    append, read_header, unpack, skip, tell = (
        ops.append,
        unpacker.read_array_header,
        unpacker.unpack,
        unpacker.skip,
        unpacker.tell,
    )
    dispatch, new_tuple, replays = int(Opcode.DISPATCH), tuple.__new__, _REPLAY_FIELDS
    for _ in range(count):
        length = read_header()
        if not 2 <= length <= _MAX_FIELDS:
            raise NotCanonical
        code, seq = unpack(), unpack()
        if type(code) is not int or type(seq) is not int:
            raise NotCanonical
        if code == dispatch and length == _DISPATCH_FIELDS + 2:
            start = tell()
            skip()
            skip()
            skip()
            skip()
            body = data[start : tell()]
            if find is not None and (entry := find(body)) is not None:  # the hot path: a repeated dispatch
                append(new_tuple(Memoized, (seq, entry)))
            else:
                append(Body(seq, body))
        elif length == replays.get(code, -1) + 2:  # keyed (opcode, body): told apart from a dispatch's bytes
            start = tell()
            for _field in range(length - 2):
                skip()
            body = data[start : tell()]
            append(new_tuple(ReplayBody, (code, seq, body, None if find is None else find((code, body)))))
        else:
            append((code, seq, *[unpack() for _ in range(length - 2)]))
    return tuple(ops)


def _unpacker(limits: Limits, size: int) -> msgpack.Unpacker:
    """The general decoder's bounds (`wire.unpack_header`), for what is decoded here."""
    return msgpack.Unpacker(
        raw=False,
        strict_map_key=True,
        use_list=False,
        max_buffer_size=max(size, 1),
        max_str_len=max(limits.max_source_bytes, limits.max_name_len),
        max_bin_len=0,
        max_ext_len=0,
        max_array_len=max(limits.max_ops_per_batch, limits.max_args, limits.max_ndim, 8),
        max_map_len=64,
    )

"""Message schema, encode and decode.

A message is a list of ZeroMQ frames: frame 0 is a msgpack map (the header), the other frames
are raw tensor payloads referenced by index from the header. Payloads never go inside msgpack.

Client -> daemon headers:
    {"t": "hello", "v": PROTOCOL_VERSION, "name": str, "pid": int}
    {"t": "batch", "ops": [op, ...], "nf": n_payload_frames, "ack": seq | None}
    {"t": "ping"}
    {"t": "bye"}

An op is a list ``[opcode, seq, *fields]`` (see ``Opcode``). Daemon -> client headers:
    {"t": "welcome", ...}                       answer to hello
    {"t": "reply", "seq": s, "ok": True, ...}   a request op (readback, kernel, sync, ...) done;
                                                readback data follows as frame 1
    {"t": "reply", "seq": s, "ok": False, "err": [code, message, failed_seq, op_name]}
    {"t": "pong"}
    {"t": "error", "code": c, "msg": m}         unattributable: every pending request fails
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Sequence
from typing import Any, NamedTuple

import msgpack

from gpud_protocol.errors import ErrorCode, ProtocolViolation
from gpud_protocol.limits import DTYPE_SIZES, Limits

PROTOCOL_VERSION = 1

Frame = bytes | memoryview


class Opcode(enum.IntEnum):
    ALLOC = 1  # [1, seq, handle, dtype, shape]
    UPLOAD = 2  # [2, seq, handle, frame_index, nbytes]
    DISPATCH = 3  # [3, seq, kernel, [gx, gy, gz], [[kind, value], ...], writes | None]
    READBACK = 4  # [4, seq, handle]                      request: reply + data frame
    FREE = 5  # [5, seq, handle]
    KERNEL = 6  # [6, seq, kernel, source, entry, {options}]   request: reply
    SYNC = 7  # [7, seq]                                request: reply when all prior work is done
    COPY = 8  # [8, seq, src, dst]
    STATS = 9  # [9, seq]                                request: reply with counters
    PUBLISH = 10  # [10, seq, handle, name, mode]
    OPEN = 11  # [11, seq, handle, name]                 request: reply with dtype, shape, mode
    UNPUBLISH = 12  # [12, seq, name]
    FLUSH = 13  # [13, seq]                               request: reply once accepted (no GPU wait)


REQUEST_OPCODES = frozenset({Opcode.READBACK, Opcode.KERNEL, Opcode.SYNC, Opcode.STATS, Opcode.OPEN, Opcode.FLUSH})


class ArgKind(enum.IntEnum):
    TENSOR = 0
    F32 = 1
    I32 = 2
    U32 = 3


RESIDENT_MODES = ("ro", "rw")
_NAME_RE = re.compile(r"[A-Za-z0-9_.:/-]+")
_OPTION_KEYS = frozenset({"block", "flags", "writes"})


Arg = tuple[int, int | float]  # (ArgKind, value); the value of a TENSOR arg is its handle


class Alloc(NamedTuple):
    seq: int
    handle: int
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPE_SIZES[self.dtype]


class Upload(NamedTuple):
    seq: int
    handle: int
    frame: int
    nbytes: int


class Dispatch(NamedTuple):
    seq: int
    kernel: int
    grid: tuple[int, int, int]
    args: tuple[Arg, ...]
    writes: tuple[int, ...] | None  # indices into args; None: the kernel's default


class Readback(NamedTuple):
    seq: int
    handle: int


class Free(NamedTuple):
    seq: int
    handle: int


class KernelOptions(NamedTuple):
    block: tuple[int, int, int] | None
    flags: tuple[str, ...]
    writes: tuple[int, ...] | None  # tensor-argument positions the kernel writes


class RegisterKernel(NamedTuple):
    seq: int
    handle: int
    source: str
    entry: str
    options: KernelOptions


class Sync(NamedTuple):
    seq: int


class Copy(NamedTuple):
    seq: int
    src: int
    dst: int


class Stats(NamedTuple):
    seq: int


class Publish(NamedTuple):
    seq: int
    handle: int
    name: str
    mode: str


class Open(NamedTuple):
    seq: int
    handle: int
    name: str


class Unpublish(NamedTuple):
    seq: int
    name: str


class FlushOp(NamedTuple):
    seq: int


Op = (
    Alloc
    | Upload
    | Dispatch
    | Readback
    | Free
    | RegisterKernel
    | Sync
    | Copy
    | Stats
    | Publish
    | Open
    | Unpublish
    | FlushOp
)


class OpError(NamedTuple):
    """An op that failed validation; reported against its sequence number."""

    seq: int
    code: ErrorCode
    message: str
    op: str


class Hello(NamedTuple):
    version: int
    name: str
    pid: int


class Batch(NamedTuple):
    ops: list[Op | OpError]
    ack: int | None
    frames: list[Frame]


class Ping(NamedTuple):
    pass


class Bye(NamedTuple):
    pass


ClientMessage = Hello | Batch | Ping | Bye


# --------------------------------------------------------------------------- encode


_packer = msgpack.Packer(use_bin_type=True)


def pack(header: dict[str, Any]) -> bytes:
    packed: bytes = _packer.pack(header)
    return packed


def encode_hello(name: str, pid: int) -> bytes:
    return pack({"t": "hello", "v": PROTOCOL_VERSION, "name": name, "pid": pid})


def encode_batch(ops: Sequence[Sequence[Any]], n_frames: int, ack: int | None) -> bytes:
    return encode_packed_batch(b"".join([_packer.pack(op) for op in ops]), len(ops), n_frames, ack)


def encode_packed_batch(packed_ops: bytes | bytearray, count: int, n_frames: int, ack: int | None) -> bytes:
    """A batch from ops already packed one by one (the client packs each op as it is queued, so
    no Python object per op outlives the call that made it)."""
    if count < 16:
        array = bytes([0x90 | count])
    elif count < 1 << 16:
        array = b"\xdc" + count.to_bytes(2, "big")
    else:
        array = b"\xdd" + count.to_bytes(4, "big")
    tail = (_NF, _packer.pack(n_frames), _ACK, _packer.pack(ack))
    return b"".join((_BATCH_PREFIX, array, packed_ops, *tail))


_BATCH_PREFIX = b"\x84" + _packer.pack("t") + _packer.pack("batch") + _packer.pack("ops")  # a map of 4
_NF, _ACK = _packer.pack("nf"), _packer.pack("ack")
PING = pack({"t": "ping"})
BYE = pack({"t": "bye"})
PONG = pack({"t": "pong"})


def encode_reply(seq: int, **fields: Any) -> bytes:
    return pack({"t": "reply", "seq": seq, "ok": True, **fields})


def encode_error_reply(seq: int, code: ErrorCode, message: str, failed_seq: int, op: str) -> bytes:
    return pack({"t": "reply", "seq": seq, "ok": False, "err": [int(code), message, failed_seq, op]})


def encode_error(code: ErrorCode, message: str) -> bytes:
    return pack({"t": "error", "code": int(code), "msg": message})


# --------------------------------------------------------------------------- decode


def unpack_header(frame: Frame, limits: Limits) -> dict[str, Any]:
    if len(frame) > limits.max_header_bytes:
        raise ProtocolViolation(ErrorCode.PROTOCOL, f"header of {len(frame)} bytes is too large")
    try:
        header = msgpack.unpackb(
            frame,
            raw=False,
            strict_map_key=True,
            use_list=False,  # arrays decode as tuples: cheaper, and ignored by the garbage collector
            max_str_len=max(limits.max_source_bytes, limits.max_name_len),
            max_bin_len=0,
            max_ext_len=0,
            max_array_len=max(limits.max_ops_per_batch, limits.max_args, 8),
            max_map_len=64,
        )
    except Exception as exc:  # msgpack raises many types: ValueError, ExtraData, FormatError...
        raise ProtocolViolation(ErrorCode.PROTOCOL, f"undecodable header: {exc}") from None
    if not isinstance(header, dict) or not isinstance(header.get("t"), str):
        raise ProtocolViolation(ErrorCode.PROTOCOL, "header must be a map with a string 't'")
    return header


DispatchMemo = dict[tuple[Any, ...], tuple[Any, ...]]
DISPATCH_MEMO_SIZE = 4096


def decode_client_message(
    frames: Sequence[Frame], limits: Limits, dispatch_memo: DispatchMemo | None = None
) -> ClientMessage:
    """Decode and validate one message from a client; raise ProtocolViolation if unusable.

    `dispatch_memo` (one per session) remembers dispatch ops that passed validation, keyed by
    everything but their sequence number, so a repeated step is not checked again. Keys compare
    by value: an op equal to a validated one (1 == 1.0 == True) is taken as that one.
    """
    if not frames:
        raise ProtocolViolation(ErrorCode.PROTOCOL, "empty message")
    header = unpack_header(frames[0], limits)
    kind = header["t"]
    if kind == "batch":
        return _decode_batch(header, frames[1:], limits, dispatch_memo)
    if len(frames) != 1:
        raise ProtocolViolation(ErrorCode.PROTOCOL, f"'{kind}' message carries no frames")
    if kind == "ping":
        return Ping()
    if kind == "bye":
        return Bye()
    if kind == "hello":
        version, name, pid = header.get("v", -1), header.get("name", ""), header.get("pid", 0)
        if not _is_int(version) or not isinstance(name, str) or not _is_int(pid):
            raise ProtocolViolation(ErrorCode.PROTOCOL, "hello needs int 'v', str 'name', int 'pid'")
        if len(name) > limits.max_name_len:
            raise ProtocolViolation(ErrorCode.PROTOCOL, "client name too long")
        return Hello(version, name, pid)
    raise ProtocolViolation(ErrorCode.PROTOCOL, f"unknown message type {kind[:32]!r}")


def _decode_batch(
    header: dict[str, Any], payloads: Sequence[Frame], limits: Limits, memo: DispatchMemo | None
) -> Batch:
    raw_ops, n_frames, ack = header.get("ops"), header.get("nf"), header.get("ack")
    if not isinstance(raw_ops, tuple) or not _is_int(n_frames):
        raise ProtocolViolation(ErrorCode.PROTOCOL, "batch needs a list 'ops' and an int 'nf'")
    if ack is not None and not _is_int(ack):
        raise ProtocolViolation(ErrorCode.PROTOCOL, "'ack' must be an int or nil")
    if len(raw_ops) > limits.max_ops_per_batch:
        raise ProtocolViolation(ErrorCode.PROTOCOL, f"more than {limits.max_ops_per_batch} ops in a batch")
    if n_frames != len(payloads) or n_frames > limits.max_frames:
        raise ProtocolViolation(
            ErrorCode.PROTOCOL, f"header announces {n_frames} payload frames, message has {len(payloads)}"
        )
    ops: list[Op | OpError] = []
    used_frames: set[int] = set()
    dispatch, new_tuple = int(Opcode.DISPATCH), tuple.__new__
    for raw in raw_ops:  # the hot loop: inline checks, no helper calls on a memo hit
        if type(raw) is not tuple or len(raw) < 2 or type(raw[0]) is not int or type(raw[1]) is not int:
            raise ProtocolViolation(ErrorCode.PROTOCOL, "an op must be a list [opcode, seq, ...]")
        if memo is not None and raw[0] == dispatch:
            try:
                fields = memo.get(raw[2:])
            except TypeError:  # a map somewhere inside: unhashable, and invalid anyway
                fields = None
            if fields is not None:
                ops.append(new_tuple(Dispatch, (raw[1], *fields)))
                continue
        try:
            op = _decode_op(raw, payloads, limits)
            if memo is not None and type(op) is Dispatch:
                if len(memo) >= DISPATCH_MEMO_SIZE:
                    memo.clear()
                memo[raw[2:]] = op[1:]
            if type(op) is Upload:
                if op.frame in used_frames:
                    raise ProtocolViolation(ErrorCode.INVALID_ARGUMENT, f"frame {op.frame} used twice")
                used_frames.add(op.frame)
            ops.append(op)
        except ProtocolViolation as exc:
            if raw[0] == Opcode.UPLOAD and len(raw) > 3 and _is_int(raw[3]) and 0 <= raw[3] < len(payloads):
                used_frames.add(raw[3])  # a failed upload consumed its frame: report the op, not the batch
            ops.append(OpError(raw[1], exc.code, exc.message, _opname(raw[0])))
    if len(used_frames) != n_frames:
        raise ProtocolViolation(ErrorCode.PROTOCOL, "some payload frames are not used by any op")
    return Batch(ops, ack, list(payloads))


def _opname(code: int) -> str:
    try:
        return Opcode(code).name.lower()
    except ValueError:
        return f"op{code}"


def _bad(message: str) -> ProtocolViolation:
    return ProtocolViolation(ErrorCode.INVALID_ARGUMENT, message)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _handle(value: object, limits: Limits) -> int:
    if not _is_int(value) or not 0 < value <= limits.max_handle:  # type: ignore[operator]
        raise _bad(f"bad handle {value!r}")
    return value  # type: ignore[return-value]


def _name(value: object, limits: Limits) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= limits.max_name_len or not _NAME_RE.fullmatch(value):
        raise _bad(f"bad name {str(value)[:40]!r}: 1-{limits.max_name_len} of [A-Za-z0-9_.:/-]")
    return value


def _int_list(value: object, length: int | None, lo: int, hi: int, what: str) -> tuple[int, ...]:
    if not isinstance(value, tuple) or (length is not None and len(value) != length):
        raise _bad(f"{what} must be a list of {length or 'some'} ints")
    if not all(_is_int(v) and lo <= v <= hi for v in value):
        raise _bad(f"{what} values must be ints in [{lo}, {hi}]")
    return tuple(value)


def _fields(raw: tuple[Any, ...], count: int) -> tuple[Any, ...]:
    if len(raw) != count + 2:
        raise _bad(f"expected {count} fields, got {len(raw) - 2}")
    return raw[2:]


def _decode_op(raw: tuple[Any, ...], payloads: Sequence[Frame], limits: Limits) -> Op:
    seq = raw[1]
    if raw[0] == Opcode.DISPATCH:  # the hot path: checked inline, without helper calls
        return _decode_dispatch(raw, limits)
    try:
        code = Opcode(raw[0])
    except ValueError:
        raise ProtocolViolation(ErrorCode.PROTOCOL, f"unknown opcode {raw[0]}") from None
    if code is Opcode.ALLOC:
        handle, dtype, shape = _fields(raw, 3)
        if not isinstance(dtype, str) or dtype not in DTYPE_SIZES:  # a list or map is unhashable
            raise _bad(f"dtype {str(dtype)[:20]!r} is not one of {sorted(DTYPE_SIZES)}")
        dims = _int_list(shape, None, 0, limits.max_tensor_bytes, "shape")
        if len(dims) > limits.max_ndim:
            raise _bad(f"more than {limits.max_ndim} dimensions")
        op = Alloc(seq, _handle(handle, limits), dtype, dims)
        if op.nbytes > limits.max_tensor_bytes:
            raise _bad(f"tensor of {op.nbytes} bytes exceeds {limits.max_tensor_bytes}")
        return op
    if code is Opcode.UPLOAD:
        handle, frame, nbytes = _fields(raw, 3)
        if not _is_int(frame) or not 0 <= frame < len(payloads):
            raise _bad(f"frame index {frame!r} out of range")
        if not _is_int(nbytes) or len(payloads[frame]) != nbytes or nbytes > limits.max_tensor_bytes:
            raise _bad(f"frame {frame} holds {len(payloads[frame])} bytes, op says {nbytes!r}")
        return Upload(seq, _handle(handle, limits), frame, nbytes)
    if code in (Opcode.READBACK, Opcode.FREE):
        (handle,) = _fields(raw, 1)
        return (Readback if code is Opcode.READBACK else Free)(seq, _handle(handle, limits))
    if code in (Opcode.SYNC, Opcode.STATS, Opcode.FLUSH):
        _fields(raw, 0)
        return Sync(seq) if code is Opcode.SYNC else Stats(seq) if code is Opcode.STATS else FlushOp(seq)
    if code is Opcode.KERNEL:
        handle, source, entry, options = _fields(raw, 4)
        if not isinstance(source, str) or not 0 < len(source.encode()) <= limits.max_source_bytes:
            raise _bad("kernel source must be a non-empty string within the size limit")
        if not isinstance(entry, str) or not entry.isidentifier() or len(entry) > limits.max_name_len:
            raise _bad(f"bad entry point {str(entry)[:40]!r}")
        return RegisterKernel(seq, _handle(handle, limits), source, entry, _kernel_options(options, limits))
    if code is Opcode.COPY:
        src, dst = _fields(raw, 2)
        return Copy(seq, _handle(src, limits), _handle(dst, limits))
    if code is Opcode.PUBLISH:
        handle, name, mode = _fields(raw, 3)
        if mode not in RESIDENT_MODES:
            raise _bad(f"mode must be one of {RESIDENT_MODES}")
        return Publish(seq, _handle(handle, limits), _name(name, limits), mode)
    if code is Opcode.OPEN:
        handle, name = _fields(raw, 2)
        return Open(seq, _handle(handle, limits), _name(name, limits))
    (name,) = _fields(raw, 1)
    return Unpublish(seq, _name(name, limits))


def _decode_dispatch(raw: tuple[Any, ...], limits: Limits) -> Dispatch:
    if len(raw) != 6:
        raise _bad(f"expected 4 fields, got {len(raw) - 2}")
    _, seq, kernel, grid, args, writes = raw
    max_handle, max_grid = limits.max_handle, limits.max_grid
    if type(kernel) is not int or not 0 < kernel <= max_handle:
        raise _bad(f"bad kernel handle {kernel!r}")
    if type(grid) is not tuple or len(grid) != 3:
        raise _bad("grid must be a list of 3 ints")
    gx, gy, gz = grid
    if type(gx) is not int or type(gy) is not int or type(gz) is not int:
        raise _bad("grid must be a list of 3 ints")
    if not (0 <= gx <= max_grid and 0 <= gy <= max_grid and 0 <= gz <= max_grid):
        raise _bad(f"grid values must be in [0, {max_grid}]")
    if type(args) is not tuple or len(args) > limits.max_args:
        raise _bad(f"args must be a list of at most {limits.max_args}")
    decoded: list[Arg] = []
    for item in args:
        if type(item) is not tuple or len(item) != 2 or type(item[0]) is not int:  # True == 1, 1.0 == 1
            raise _bad("each arg must be [kind, value]")
        kind, v = item
        t = type(v)
        if t is float:
            valid = kind == 1
        elif t is int and kind == 1:
            item, valid = (1, float(v)), True
        elif t is int:
            valid = (
                (kind == 0 and 0 < v <= max_handle)
                or (kind == 2 and -(1 << 31) <= v < (1 << 31))
                or (kind == 3 and 0 <= v < (1 << 32))
            )
        else:
            valid = False
        if valid:
            decoded.append(item)
        else:
            raise _bad(f"bad arg [{str(kind)[:8]}, {str(v)[:20]}]")
    if writes is not None:
        writes = _int_list(writes, None, 0, limits.max_args - 1, "writes")
    return Dispatch(seq, kernel, (gx, gy, gz), tuple(decoded), writes)


def _kernel_options(value: object, limits: Limits) -> KernelOptions:
    if not isinstance(value, dict) or len(value) > limits.max_options or not set(value) <= _OPTION_KEYS:
        raise _bad(f"kernel options must be a map with keys from {sorted(_OPTION_KEYS)}")
    block = value.get("block")
    flags = value.get("flags", ())
    writes = value.get("writes")
    if not isinstance(flags, tuple) or len(flags) > limits.max_options:
        raise _bad("flags must be a list of strings")
    if not all(isinstance(f, str) and f.startswith("-") and len(f) <= 256 for f in flags):
        raise _bad("each compiler flag must be a string starting with '-'")
    return KernelOptions(
        None if block is None else _int_list(block, 3, 1, 1024, "block"),  # type: ignore[arg-type]
        tuple(flags),
        None if writes is None else _int_list(writes, None, 0, limits.max_args - 1, "writes"),
    )


# --------------------------------------------------------------------------- client side


class ServerMessage(NamedTuple):
    header: dict[str, Any]
    frames: list[Any]


def decode_server_message(frames: Sequence[Any], limits: Limits) -> ServerMessage:
    """Decode a daemon message on the client (bounded like everything else)."""
    first = frames[0]
    header = unpack_header(first.buffer if hasattr(first, "buffer") else first, limits)
    return ServerMessage(header, list(frames[1:]))

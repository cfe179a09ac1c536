"""The message schema: one definition of each op, used by the client's encoder and the daemon's decoder.

A message is a list of ZeroMQ frames: frame 0 is a msgpack map (the header), the other frames are
raw tensor payloads referenced by index from the header. Payloads never go inside msgpack.

Client -> daemon headers:
    {"t": "hello", "v": PROTOCOL_VERSION, "name": str, "pid": int, "device": int | None}
    {"t": "batch", "ops": [op, ...], "nf": payload frames, "ack": [failed seq, ...] | None,
     "b": batch number (1, 2, 3...), "rc": True if the client wants a receipt}
    {"t": "ping"}
    {"t": "beat", "session": id, "key": beat key}   from any socket: keeps that session's lease
    {"t": "bye"}

An op is a list ``[opcode, seq, *fields]``; its fields are those of the NamedTuple below, in order.
Daemon -> client headers:
    {"t": "welcome", ...}                          answer to hello (see `Welcome`)
    {"t": "reply", "seq": s, "ok": True, ...}      a request op done; its fields per `REPLY_FIELDS`;
                                                   a readback's first data part follows as frame 1
    {"t": "part", "seq": s, "i": k}                part k >= 1 of a readback's data, as frame 1
    {"t": "reply", "seq": s, "ok": False, "err": [code, message, failed_seq, op name]}
    {"t": "receipt", "b": n}                       batches up to n are executed (when "rc" asked)
    {"t": "pong"}
    {"t": "error", "code": c, "msg": m}            unattributable: every pending request fails
"""

from __future__ import annotations

import enum
from typing import Annotated, Any, NamedTuple

from gpud_protocol.limits import DTYPE_SIZES

PROTOCOL_VERSION = 2


class Opcode(enum.IntEnum):
    ALLOC = 1
    UPLOAD = 2
    DISPATCH = 3
    READBACK = 4
    FREE = 5
    KERNEL = 6
    SYNC = 7
    COPY = 8
    STATS = 9
    PUBLISH = 10
    OPEN = 11
    UNPUBLISH = 12
    FLUSH = 13


class ArgKind(enum.IntEnum):
    TENSOR = 0
    F32 = 1
    I32 = 2
    U32 = 3


SCALAR_NAMES = {ArgKind.F32: "f32", ArgKind.I32: "i32", ArgKind.U32: "u32"}
RESIDENT_MODES = ("ro", "rw")


class Field(enum.Enum):
    """What a field holds; the codec checks each kind the same way wherever it appears."""

    HANDLE = "handle"
    DTYPE = "dtype"
    SHAPE = "shape"
    DEVICE = "device"
    FRAME = "frame"
    NBYTES = "nbytes"
    SOURCE = "source"
    ENTRY = "entry"
    OPTIONS = "options"
    GRID = "grid"
    ARGS = "args"
    WRITES = "writes"
    NAME = "name"
    MODE = "mode"


Handle = Annotated[int, Field.HANDLE]  # 1 .. max_handle, chosen by the client
DType = Annotated[str, Field.DTYPE]  # a key of DTYPE_SIZES
Shape = Annotated[tuple[int, ...], Field.SHAPE]
Device = Annotated[int, Field.DEVICE]  # index into the welcome's device list
FrameIndex = Annotated[int, Field.FRAME]  # index of a payload frame of this message
NBytes = Annotated[int, Field.NBYTES]
Source = Annotated[str, Field.SOURCE]
Entry = Annotated[str, Field.ENTRY]
Grid = Annotated[tuple[int, int, int], Field.GRID]
Arg = tuple[int, int | float]  # (ArgKind, value); a TENSOR's value is its handle
Args = Annotated[tuple[Arg, ...], Field.ARGS]
Writes = Annotated["tuple[int, ...] | None", Field.WRITES]  # tensor-argument positions; None: the kernel's own
Name = Annotated[str, Field.NAME]  # 1..max_name_len of [A-Za-z0-9_.:/-]
Mode = Annotated[str, Field.MODE]  # "ro" | "rw"


class KernelOptions(NamedTuple):
    """On the wire a map with any of these keys."""

    block: tuple[int, int, int] | None = None  # CUDA threads per block
    flags: tuple[str, ...] = ()  # compiler flags (CUDA only, whitelisted)
    writes: tuple[int, ...] | None = None  # tensor-argument positions the kernel writes, declared


Options = Annotated[KernelOptions, Field.OPTIONS]


class Alloc(NamedTuple):
    """A zero-filled tensor on `device`."""

    seq: int
    handle: Handle
    dtype: DType
    shape: Shape
    device: Device

    @property
    def nbytes(self) -> int:
        size = DTYPE_SIZES[self.dtype]
        for dim in self.shape:
            size *= dim
        return size


class Upload(NamedTuple):
    """Copy payload frame `frame` (exactly the tensor's bytes) into the tensor, in op order."""

    seq: int
    handle: Handle
    frame: FrameIndex
    nbytes: NBytes


class Dispatch(NamedTuple):
    """Run `kernel` over `grid` workgroups on the device of its tensor arguments."""

    seq: int
    kernel: Handle
    grid: Grid
    args: Args
    writes: Writes


class Readback(NamedTuple):
    """Request: the tensor's bytes, in reply parts of at most `reply_part_bytes`."""

    seq: int
    handle: Handle


class Free(NamedTuple):
    seq: int
    handle: Handle


class RegisterKernel(NamedTuple):
    """Request: compile (or find) a kernel; the reply names the handle to use and what it writes."""

    seq: int
    handle: Handle
    source: Source
    entry: Entry
    options: Options


class Sync(NamedTuple):
    """Request: answered once every earlier op of the session has completed on its devices."""

    seq: int


class Copy(NamedTuple):
    """Copy `src` into `dst` (same dtype and shape; they may live on different devices)."""

    seq: int
    src: Handle
    dst: Handle


class Stats(NamedTuple):
    """Request: counters of the session, its devices and the daemon."""

    seq: int


class Publish(NamedTuple):
    seq: int
    handle: Handle
    name: Name
    mode: Mode


class Open(NamedTuple):
    """Request: a handle to the resident tensor `name`; the reply gives dtype, shape, mode, device."""

    seq: int
    handle: Handle
    name: Name


class Unpublish(NamedTuple):
    seq: int
    name: Name


class FlushOp(NamedTuple):
    """Request: answered once the daemon executed every earlier op (no wait for the GPU)."""

    seq: int


Op = (
    Alloc | Upload | Dispatch | Readback | Free | RegisterKernel | Sync
    | Copy | Stats | Publish | Open | Unpublish | FlushOp
)


class OpSpec(NamedTuple):
    opcode: Opcode
    type: type[Any]
    request: bool  # answered with a reply; the others are answered only when they fail
    name: str  # how errors name it


def _spec(opcode: Opcode, cls: type[Any], request: bool) -> OpSpec:
    return OpSpec(opcode, cls, request, opcode.name.lower())


# The one table of ops: which NamedTuple each opcode decodes to, and which ops are requests.
OPS: dict[Opcode, OpSpec] = {
    spec.opcode: spec
    for spec in (
        _spec(Opcode.ALLOC, Alloc, False),
        _spec(Opcode.UPLOAD, Upload, False),
        _spec(Opcode.DISPATCH, Dispatch, False),
        _spec(Opcode.READBACK, Readback, True),
        _spec(Opcode.FREE, Free, False),
        _spec(Opcode.KERNEL, RegisterKernel, True),
        _spec(Opcode.SYNC, Sync, True),
        _spec(Opcode.COPY, Copy, False),
        _spec(Opcode.STATS, Stats, True),
        _spec(Opcode.PUBLISH, Publish, False),
        _spec(Opcode.OPEN, Open, True),
        _spec(Opcode.UNPUBLISH, Unpublish, False),
        _spec(Opcode.FLUSH, FlushOp, True),
    )
}
SPEC_OF_TYPE: dict[type[Any], OpSpec] = {spec.type: spec for spec in OPS.values()}
REQUEST_OPCODES = frozenset(code for code, spec in OPS.items() if spec.request)

# Fields of each request's successful reply (besides t, seq, ok).
REPLY_FIELDS: dict[Opcode, tuple[str, ...]] = {
    Opcode.READBACK: ("n", "parts"),  # total bytes, number of data parts
    Opcode.KERNEL: ("handle", "writes"),  # the handle to use (an earlier one for the same kernel)
    Opcode.SYNC: (),
    Opcode.STATS: ("stats",),
    Opcode.OPEN: ("dtype", "shape", "mode", "device"),
    Opcode.FLUSH: (),
}


def op_name(opcode: int) -> str:
    spec = OPS.get(opcode)  # type: ignore[call-overload]
    return spec.name if spec is not None else f"op{opcode}"


class OpError(NamedTuple):
    """An op that failed validation; reported against its sequence number."""

    seq: int
    code: int  # an ErrorCode
    message: str
    op: str


class Hello(NamedTuple):
    version: int
    name: str
    pid: int
    device: int | None  # the session's default device; None: the daemon picks the least loaded


class Batch(NamedTuple):
    ops: list[Op | OpError]
    ack: tuple[int, ...]  # failed seqs the client has seen
    frames: list[Any]
    number: int  # 1, 2, 3... per session; 0 from clients that do not count
    receipt: bool


class Ping(NamedTuple):
    pass


class Beat(NamedTuple):
    session: str
    key: str


class Bye(NamedTuple):
    pass


ClientMessage = Hello | Batch | Ping | Beat | Bye

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
    {"t": "status"}                                no session needed: answered with the daemon's state

An op is a list ``[opcode, seq, *fields]``; its fields are those of the NamedTuple below, in order.
A tensor operand (`Operand`, a dispatch's tensor argument) is a handle or a view of one,
``[handle, offset, [shape...], [strides...]]`` (`gpud_protocol.views`): a view needs no handle.
Daemon -> client headers:
    {"t": "welcome", ...}                          answer to hello (see `Welcome`)
    {"t": "reply", "seq": s, "ok": True, ...}      a request op done; its fields per `REPLY_FIELDS`;
                                                   a readback's first data part follows as frame 1
    {"t": "part", "seq": s, "i": k}                part k >= 1 of a readback's data, as frame 1
    {"t": "reply", "seq": s, "ok": False, "err": [code, message, failed_seq, op name]}
    {"t": "receipt", "b": n}                       batches up to n are executed (when "rc" asked)
    {"t": "pong"}
    {"t": "error", "code": c, "msg": m}            unattributable: every pending request fails
    {"t": "status", "version": str, "backend": str, "state": "serving" | "stopping", "uptime_s": float,
     "health": {"healthy": bool, "problems": [str], "stall_s": float}, "devices": [map], "sessions": [map],
     "residents": [map], "graphs": [map], "counters": map, ...}
                                                   answer to status (gpud.service.server.Server.status:
                                                   operators' tools, not the client library, read it)
"""

from __future__ import annotations

import enum
from typing import Annotated, Any, NamedTuple

from gpud_protocol.limits import DTYPE_SIZES
from gpud_protocol.memo import Memoized
from gpud_protocol.views import TensorView

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
    GRAPH = 14
    REPLAY = 15
    LAUNCH = 16
    FREE_GRAPH = 17
    PUBLISH_GRAPH = 18
    OPEN_GRAPH = 19
    UNPUBLISH_GRAPH = 20
    RESHAPE = 21
    UPLOAD_PART = 22
    OPEN_PREFIX = 23
    RESIDENTS = 24


class ArgKind(enum.IntEnum):
    TENSOR = 0  # a session tensor: the value is its handle (in a dispatch, a handle or a `TensorView`)
    F32 = 1
    I32 = 2
    U32 = 3
    INPUT = 4  # in a graph recording: the value indexes the graph's inputs
    BIND = 5  # ... its bound tensors
    TEMP = 6  # ... its intermediates
    SCALAR = 7  # ... its scalars
    VIEW = 8  # ... its views (a tensor of the graph with another shape)


GRAPH_TENSOR_KINDS = frozenset({ArgKind.TENSOR, ArgKind.INPUT, ArgKind.BIND, ArgKind.TEMP, ArgKind.VIEW})


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
    GRAPH = "graph"
    FRAME_OR_NONE = "frame_or_none"
    SHAPES = "shapes"
    VALUES = "values"
    HANDLES = "handles"
    TENSOR = "tensor"
    TENSORS = "tensors"
    PREFIX = "prefix"


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
DispatchArg = tuple[int, "int | float | TensorView"]  # (ArgKind, value); a TENSOR's value a handle or a view
Args = Annotated[tuple[DispatchArg, ...], Field.ARGS]
Operand = Annotated["int | TensorView", Field.TENSOR]  # a tensor: its handle, or a view of it (`views`)
Operands = Annotated["tuple[int | TensorView, ...]", Field.TENSORS]
Writes = Annotated["tuple[int, ...] | None", Field.WRITES]  # tensor-argument positions; None: the kernel's own
Name = Annotated[str, Field.NAME]  # 1..max_name_len of [A-Za-z0-9_.:/-]
Mode = Annotated[str, Field.MODE]  # "ro" | "rw"
Prefix = Annotated[str, Field.PREFIX]  # 0..max_name_len of [A-Za-z0-9_.:/-]: the start of resident names


class KernelOptions(NamedTuple):
    """On the wire a map with any of these keys."""

    block: tuple[int, int, int] | None = None  # CUDA threads per block
    flags: tuple[str, ...] = ()  # compiler flags (CUDA only, whitelisted)
    writes: tuple[int, ...] | None = None  # tensor-argument positions the kernel writes, declared
    shared: int = 0  # CUDA dynamic shared memory per block, bytes (extern __shared__)


Options = Annotated[KernelOptions, Field.OPTIONS]


class GraphTensor(NamedTuple):
    """An input (uploaded per replay) or a bound tensor (chosen per replay) of a graph."""

    name: str
    dtype: str
    shape: tuple[int, ...]


class GraphScalar(NamedTuple):
    name: str
    kind: int  # ArgKind.F32 | I32 | U32


class GraphDispatch(NamedTuple):
    kernel: int
    grid: tuple[int, int, int]
    args: tuple[Arg, ...]  # kinds TENSOR (a session tensor), INPUT, BIND, TEMP, SCALAR, or a fixed scalar
    writes: tuple[int, ...] | None


class GraphCopy(NamedTuple):
    src: Arg  # (kind, index or handle) of a tensor
    dst: Arg


class GraphUpload(NamedTuple):
    """Recorded data (a payload frame of the building message), copied into `dst` at this point of every replay."""

    frame: int
    dst: Arg


class GraphOutput(NamedTuple):
    name: str
    ref: Arg


class GraphDef(NamedTuple):
    """A recorded step. On the wire a map of these keys, each a list; see codec for the forms."""

    inputs: tuple[GraphTensor, ...]
    scalars: tuple[GraphScalar, ...]
    binds: tuple[GraphTensor, ...]
    temps: tuple[tuple[str, tuple[int, ...]], ...]  # (dtype, shape) of each intermediate
    steps: tuple[GraphDispatch | GraphCopy | GraphUpload, ...]
    outputs: tuple[GraphOutput, ...]
    views: tuple[tuple[Arg, tuple[int, ...]], ...] = ()  # (tensor, shape): the same memory, another shape


Graph = Annotated[GraphDef, Field.GRAPH]
FrameOrNone = Annotated[int, Field.FRAME_OR_NONE]  # a payload frame index, or -1: none
Shapes = Annotated[tuple[tuple[int, ...], ...], Field.SHAPES]
Values = Annotated[tuple[int | float, ...], Field.VALUES]
Handles = Annotated[tuple[int, ...], Field.HANDLES]


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
    handle: Operand
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
    handle: Operand


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
    src: Operand
    dst: Operand


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


class BuildGraph(NamedTuple):
    """Request: validate and instantiate a recorded step as graph `handle`; a second build of the same
    name with other input shapes adds an instance (one per shape). The reply says which handle to use."""

    seq: int
    handle: Handle
    name: Name
    graph: Graph


class Replay(NamedTuple):
    """Request: run a graph with the inputs packed in `frame` (shapes in `shapes`), the scalars in
    order and the bound tensors in order; the reply carries the outputs packed in one buffer."""

    seq: int
    graph: Handle
    frame: FrameOrNone
    shapes: Shapes
    scalars: Values
    binds: Operands


class Launch(NamedTuple):
    """As `Replay`, without reading the outputs back: queued like a dispatch."""

    seq: int
    graph: Handle
    frame: FrameOrNone
    shapes: Shapes
    scalars: Values
    binds: Operands


class Reshape(NamedTuple):
    """A new handle on `src`'s memory with another shape of as many elements. Kept for clients from
    before views: `Tensor.reshape` now makes a `TensorView`, which needs no handle."""

    seq: int
    handle: Handle
    src: Handle
    shape: Shape


class FreeGraph(NamedTuple):
    seq: int
    graph: Handle


class PublishGraph(NamedTuple):
    seq: int
    graph: Handle
    name: Name


class OpenGraph(NamedTuple):
    """Request: a handle to the published graph `name`; the reply gives its inputs, scalars, binds, outputs."""

    seq: int
    handle: Handle
    name: Name


class UnpublishGraph(NamedTuple):
    seq: int
    name: Name


class UploadPart(NamedTuple):
    """Copy payload frame `frame` (`nbytes`) into the tensor's bytes from `offset` on, in op order: an
    upload larger than one message travels as several. `offset` is a multiple of 4, and so is `nbytes`
    unless the part ends the tensor (WebGPU copies whole 4-byte words)."""

    seq: int
    handle: Operand
    frame: FrameIndex
    offset: NBytes
    nbytes: NBytes


# Resident tensors one `OpenPrefix` opens, and one `ListResidents` reply lists, at most.
RESIDENTS_PER_REPLY = 1024


class OpenPrefix(NamedTuple):
    """Request: a handle to every resident tensor whose name starts with `prefix` (all or none; at most
    RESIDENTS_PER_REPLY), the i-th in name order as handle `handle + i`. The reply lists
    [name, handle, dtype, shape, mode, device] of each."""

    seq: int
    handle: Handle
    prefix: Prefix


class ListResidents(NamedTuple):
    """Request: the resident tensors whose names start with `prefix` and sort after `after` (""
    from the first), in name order, at most RESIDENTS_PER_REPLY: [name, dtype, shape, mode, nbytes,
    device] of each, and how many match the prefix in all."""

    seq: int
    prefix: Prefix
    after: Prefix


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
    | BuildGraph
    | Replay
    | Launch
    | FreeGraph
    | PublishGraph
    | OpenGraph
    | UnpublishGraph
    | Reshape
    | UploadPart
    | OpenPrefix
    | ListResidents
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
        _spec(Opcode.GRAPH, BuildGraph, True),
        _spec(Opcode.REPLAY, Replay, True),
        _spec(Opcode.LAUNCH, Launch, False),
        _spec(Opcode.FREE_GRAPH, FreeGraph, False),
        _spec(Opcode.PUBLISH_GRAPH, PublishGraph, False),
        _spec(Opcode.OPEN_GRAPH, OpenGraph, True),
        _spec(Opcode.UNPUBLISH_GRAPH, UnpublishGraph, False),
        _spec(Opcode.RESHAPE, Reshape, False),
        _spec(Opcode.UPLOAD_PART, UploadPart, False),
        _spec(Opcode.OPEN_PREFIX, OpenPrefix, True),
        _spec(Opcode.RESIDENTS, ListResidents, True),
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
    Opcode.GRAPH: ("handle", "device"),
    Opcode.REPLAY: ("n", "parts", "outputs"),  # outputs: [[name, dtype, shape, offset], ...] in the packed data
    Opcode.OPEN_GRAPH: ("inputs", "scalars", "binds", "outputs", "device"),
    Opcode.OPEN_PREFIX: ("tensors",),  # [[name, handle, dtype, shape, mode, device], ...]
    Opcode.RESIDENTS: ("residents", "total"),  # [[name, dtype, shape, mode, nbytes, device], ...], matches
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
    ops: list[Op | OpError | Memoized]  # a dispatch its session's memo holds comes as `Memoized`
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


class Status(NamedTuple):
    """A daemon-level request (`gpud status`, `gpud stats`): needs no session."""


ClientMessage = Hello | Batch | Ping | Beat | Bye | Status

"""The ops a batch carries, one NamedTuple each: on the wire ``[opcode, seq, *fields]``, the fields in
order; each field's annotation names its kind (`field_types`), from which the daemon checks it."""

from __future__ import annotations

from typing import NamedTuple

from gpud_protocol.field_types import (
    Args,
    Device,
    DType,
    Entry,
    Flag,
    FrameIndex,
    FrameOrNone,
    Graph,
    Grid,
    Handle,
    Mode,
    Name,
    NBytes,
    Operand,
    Operands,
    Options,
    Prefix,
    Shape,
    Shapes,
    Source,
    Steps,
    Values,
    Writes,
)
from gpud_protocol.limits import DTYPE_SIZES


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


class ReplaySteps(NamedTuple):
    """Request: `steps` replays back to back, the inputs of each step packed one after the other in
    `frame` (`shapes`: one step's), the outputs the graph feeds (`GraphDef.feeds`) copied on the device
    into the next step's inputs; the reply carries every step's outputs, step after step. `chain`: the
    first step's fed inputs too come from the device, from the last step of this session's previous
    `ReplaySteps` of the same instance (its frame still holds a value for them, not used)."""

    seq: int
    graph: Handle
    frame: FrameOrNone
    shapes: Shapes
    scalars: Values
    binds: Operands
    steps: Steps
    chain: Flag = False


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
    | ReplaySteps
    | FreeGraph
    | PublishGraph
    | OpenGraph
    | UnpublishGraph
    | Reshape
    | UploadPart
    | OpenPrefix
    | ListResidents
)

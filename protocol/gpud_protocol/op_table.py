"""The one table of ops: the opcode of each op type, which ops are requests, and what their replies hold."""

from __future__ import annotations

import enum
from typing import Any, NamedTuple

from gpud_protocol.op_types import (
    Alloc,
    BuildGraph,
    Copy,
    Dispatch,
    FlushOp,
    Free,
    FreeGraph,
    Launch,
    ListResidents,
    Open,
    OpenGraph,
    OpenPrefix,
    Publish,
    PublishGraph,
    Readback,
    RegisterKernel,
    Replay,
    ReplaySteps,
    Reshape,
    Stats,
    Sync,
    Unpublish,
    UnpublishGraph,
    Upload,
    UploadPart,
)


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
    REPLAY_STEPS = 25


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
        _spec(Opcode.REPLAY_STEPS, ReplaySteps, True),
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
    Opcode.REPLAY_STEPS: ("n", "parts", "outputs", "steps"),  # one step's layout; the steps one after another
    Opcode.OPEN_GRAPH: ("inputs", "scalars", "binds", "outputs", "device"),
    Opcode.OPEN_PREFIX: ("tensors",),  # [[name, handle, dtype, shape, mode, device], ...]
    Opcode.RESIDENTS: ("residents", "total"),  # [[name, dtype, shape, mode, nbytes, device], ...], matches
}


def op_name(opcode: int) -> str:
    spec = OPS.get(opcode)  # type: ignore[call-overload]
    return spec.name if spec is not None else f"op{opcode}"

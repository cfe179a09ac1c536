"""A session's ops on many resident tensors at once, and uploads in parts.

`open_prefix` opens every resident whose name starts with a prefix in one request, `residents`
lists them; both see exactly what `open` would open by name (every published name, with the mode
its publisher chose). `upload_part` copies one part of a tensor's bytes, so a tensor larger than
a message is uploaded in several.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import gpud_protocol as proto
from gpud.runtime.runtime import Wait
from gpud.session.tensors import Handle
from gpud_protocol.errors import InvalidArgument, OutOfMemory

if TYPE_CHECKING:
    from gpud.session.state import SessionState as Session

LIMIT = proto.RESIDENTS_PER_REPLY


def upload_part(session: Session, op: proto.UploadPart, batch: proto.Batch) -> Wait | None:
    if isinstance(op.handle, proto.TensorView):  # offsets count from a tensor's start, not a view's
        raise InvalidArgument("an upload part goes into a tensor's handle, not into a view of it")
    handle = session._writable(op.handle)
    tensor = handle.tensor
    end = op.offset + op.nbytes
    if end > tensor.nbytes:
        raise InvalidArgument(
            f"a part of {op.nbytes} bytes at byte {op.offset} reaches past the {tensor.nbytes} bytes of "
            f"{handle.describe()}: nothing was written"
        )
    if op.offset % 4 or (op.nbytes % 4 and end != tensor.nbytes):
        raise InvalidArgument(
            f"a part of {op.nbytes} bytes at byte {op.offset}: parts start at a multiple of 4 bytes and hold "
            "a multiple of 4 unless they end the tensor"
        )
    rt = session.runtimes[tensor.device]
    if rt.saturated:
        return Wait(rt.unsaturated(), lambda: upload_part(session, op, batch))
    frame = batch.frames[op.frame]
    data = frame.buffer if hasattr(frame, "buffer") else memoryview(frame)
    session.touched.add(rt.index)
    return rt.upload(tensor.buffer, data.cast("B") if data.format != "B" else data, session, at=op.offset)


def open_prefix(session: Session, op: proto.OpenPrefix, _batch: proto.Batch) -> None:
    """All or nothing: handles `op.handle + i` for the i-th match, each checked before any is opened."""
    session._admit()
    residents = session._residents
    found, total = residents.matching(op.prefix, "", LIMIT)
    if total > LIMIT:
        raise InvalidArgument(
            f"{total} resident tensors start with {op.prefix!r}, more than the {LIMIT} one open_prefix opens: "
            "open a longer prefix (nothing was opened)"
        )
    last, max_handle = op.handle + len(found) - 1, session._settings.limits.max_handle
    if last > max_handle:  # a handle past it could never be named again: not even freed
        raise InvalidArgument(
            f"{len(found)} resident tensors start with {op.prefix!r}: handles {op.handle} to {last} pass the "
            f"largest handle, {max_handle} (nothing was opened)"
        )
    room = session._settings.session_max_handles - len(session.handles)
    if len(found) > room:
        raise OutOfMemory(
            f"opening {len(found)} resident tensors would pass this session's {session._settings.session_max_handles} "
            "open tensor handles (nothing was opened)"
        )
    for index in range(len(found)):
        session._new_handle(op.handle + index)
    opened = []
    for index, (name, _) in enumerate(found):
        tensor = residents.open(name)
        handle_id = op.handle + index
        session._hold(handle_id, Handle(tensor, tensor.mode == "rw", tensor.shape))
        opened.append(
            [name, handle_id, tensor.dtype, list(tensor.shape), tensor.mode, session.shown_device(tensor.device)]
        )
    session._reply(op.seq, tensors=opened)


def list_residents(session: Session, op: proto.ListResidents, _batch: proto.Batch) -> None:
    session._admit()
    found, total = session._residents.matching(op.prefix, op.after, LIMIT)
    listed = [[name, t.dtype, list(t.shape), t.mode, t.nbytes, session.shown_device(t.device)] for name, t in found]
    session._reply(op.seq, residents=listed, total=total)

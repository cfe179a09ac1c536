"""Uploads in parts: a tensor's bytes as several `UploadPart` ops, each part a payload frame of its
own, so no message and no frame grows with the tensor (`gpu.tensor(a)` of a tensor larger than a
message, and the checkpoint loader, which streams a file chunk by chunk)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import gpud_protocol as proto
from gpud_client.batch import frame_budget
from gpud_client.errors import InvalidArgument

if TYPE_CHECKING:
    from gpud_client.liveness import Connection
    from gpud_client.tensor import Tensor


class PartSender(Protocol):
    """What an upload in parts needs of the client (gpud_client.client_base.ClientBase)."""

    _connection: Connection

    def _handle_of(self, tensor: Tensor) -> int: ...

    def _next_seq(self) -> int: ...

    def _queue(self, op: proto.Op, request: int | None = None) -> None: ...


def part_bytes(limits: proto.Limits, wanted: int | None = None) -> int:
    """A part size: `wanted` (default: as large as a message allows), at most one message's payload,
    a multiple of 4 (a part that does not end the tensor must be)."""
    budget = frame_budget(limits)
    size = budget if wanted is None else min(int(wanted), budget)
    size -= size % 4
    if size < 4:
        raise InvalidArgument(f"an upload part holds at least 4 bytes, not {wanted}")
    return size


def queue_part(client: PartSender, tensor: Tensor, offset: int, data: Any) -> int:
    """Queue the copy of `data` (bytes-like) into `tensor`'s bytes from `offset` on; its seq."""
    if tensor.base is not tensor:
        raise InvalidArgument(f"{tensor!r}: an upload in parts goes into a tensor, not a view of it")
    handle = client._handle_of(tensor)
    connection = client._connection
    index = connection.queue.add_frame(data)
    if index is None:  # this payload goes with the next batch
        connection.send_batch()
        index = connection.queue.add_frame(data)
        assert index is not None
    seq = client._next_seq()
    client._queue(proto.UploadPart(seq, handle, index, offset, len(data)))
    return seq


def upload_in_parts(client: PartSender, tensor: Tensor, payload: bytes, size: int) -> None:
    """`payload` (all of `tensor`'s bytes) in parts of `size` bytes (a multiple of 4)."""
    view = memoryview(payload)
    for offset in range(0, len(payload), size):
        queue_part(client, tensor, offset, view[offset : offset + size])

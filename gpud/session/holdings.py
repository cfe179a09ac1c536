"""A session's tensor handles and its quota: allocations, reshapes, frees, and publishing and
opening resident tensors (the store itself is `residents`)."""

from __future__ import annotations

import math

import gpud_protocol as proto
from gpud.session.state import SessionState
from gpud.session.tensors import Handle, Tensor
from gpud_protocol.errors import InvalidArgument, NotFound, OutOfMemory, PermissionDenied


class Holdings(SessionState):
    def _alloc(self, op: proto.Alloc, _batch: proto.Batch) -> None:
        self._new_handle(op.handle)
        rt = self._runtime(op.device)
        nbytes = op.nbytes
        quota = self._settings.session_memory_bytes
        used = self.private_bytes[rt.index]
        if used + nbytes > quota:
            raise OutOfMemory(
                f"session quota of {quota} bytes on device {op.device} exceeded ({used} in use, {nbytes} requested)"
            )
        tensor = Tensor(rt.alloc(nbytes), op.dtype, op.shape, charged_to=self)
        self.private_bytes[rt.index] += nbytes
        self._charged.add(tensor)
        self._hold(op.handle, Handle(tensor, True, op.shape))

    def _free(self, op: proto.Free, _batch: proto.Batch) -> None:
        self._free_handle(op.handle)

    def _free_handle(self, handle_id: int) -> None:
        handle = self.handles.pop(handle_id, None)
        if handle is None:
            raise NotFound(f"unknown tensor handle {handle_id}")
        self._prepared.forget(handle_id)
        tensor = handle.tensor
        self._held[tensor] -= 1
        if not self._held[tensor]:
            del self._held[tensor]
        self.uncharge_if_unheld(tensor)
        self._residents.drop(tensor)

    def uncharge_if_unheld(self, tensor: Tensor) -> None:
        """Stop counting `tensor` in the quota once this session neither holds nor publishes it."""
        if tensor not in self._charged or tensor in self._held:
            return
        if tensor.name is not None and tensor.publisher == self.id:
            return
        self._uncharge(tensor)

    def _uncharge(self, tensor: Tensor) -> None:
        self._charged.discard(tensor)
        tensor.charged_to = None
        self.private_bytes[tensor.device] -= tensor.nbytes

    def _reshape(self, op: proto.Reshape, _batch: proto.Batch) -> None:
        self._new_handle(op.handle)
        src = self._handle(op.src)
        if math.prod(op.shape) != math.prod(src.shape):
            raise InvalidArgument(f"cannot reshape {src.describe()} to {list(op.shape)}: the element counts differ")
        src.tensor.refs += 1
        self._hold(op.handle, Handle(src.tensor, src.writable, op.shape))

    def _publish(self, op: proto.Publish, _batch: proto.Batch) -> None:
        handle = self._handle(op.handle)
        if handle.shape != handle.tensor.shape:
            raise InvalidArgument(f"publish the tensor as allocated, {handle.tensor.describe()}, not a reshaped handle")
        if not handle.writable and op.mode == "rw":
            raise PermissionDenied("a read-only tensor cannot be republished read-write")
        self._residents.publish(handle.tensor, op.name, op.mode, by=self.id)

    def _open(self, op: proto.Open, _batch: proto.Batch) -> None:
        self._admit()
        self._new_handle(op.handle)
        tensor = self._residents.open(op.name)
        self._hold(op.handle, Handle(tensor, tensor.mode == "rw", tensor.shape))
        self._reply(
            op.seq,
            dtype=tensor.dtype,
            shape=list(tensor.shape),
            mode=tensor.mode,
            device=self.shown_device(tensor.device),
        )

    def _unpublish(self, op: proto.Unpublish, _batch: proto.Batch) -> None:
        self._residents.unpublish(op.name, by=self.id)

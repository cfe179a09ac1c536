"""The device tensor: a handle to memory a session owns, or a view of it (gpud_client.views)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

import gpud_protocol as proto
from gpud_client.dtypes import HostDType, from_storage, values_dtype
from gpud_client.scope import made as scope_made
from gpud_client.values import TENSOR
from gpud_client.views import TensorViews, picked

if TYPE_CHECKING:
    from gpud_client.client import Client


class Tensor(TensorViews):
    """A device tensor owned by a session (or opened from a resident name). Zero-filled when made.

    A view (`reshape`, `transpose`, `permute`, `narrow`: gpud_client.views) is a Tensor too: its `base`
    is the tensor whose memory it is, `handle` is the base's, and it travels as a `TensorView` (the
    base's handle with its own offset, shape and strides)."""

    def __init__(
        self,
        client: Client,
        handle: int,
        dtype: HostDType,
        shape: tuple[int, ...],
        device: int,
        mode: str = "rw",
        base: Tensor | None = None,
        offset: int = 0,
        strides: tuple[int, ...] | None = None,
    ) -> None:
        self._client = client
        self.handle = handle
        self.dtype = dtype
        self.shape = shape
        self.device = device
        self.mode = mode
        self._freed = False
        self.base: Tensor = self if base is None else base  # the tensor whose memory this is
        self.offset = offset  # in elements, into the base's memory
        self.strides = proto.contiguous_strides(shape) if strides is None else strides  # in elements
        # how the daemon is told which tensor: the handle, or the base's handle with this view's geometry
        self.ref: int | proto.TensorView = (
            handle if base is None else proto.TensorView(handle, offset, shape, self.strides)
        )
        self._wire = (TENSOR, self.ref)  # as a dispatch argument
        if client._scopes:  # a scope is open: the tensor is its
            scope_made(client, self)

    @property
    def freed(self) -> bool:
        """Freed, or a view of a freed tensor: no longer usable."""
        return self._freed or self.base._freed

    @freed.setter
    def freed(self, value: bool) -> None:
        self._freed = value

    @property
    def is_view(self) -> bool:
        return self.base is not self

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    async def numpy(self) -> np.ndarray[Any, Any]:
        """Flush queued work and read the tensor back (a bfloat16 tensor as float32 values, exact)."""
        client = self._client
        seq = client._next_seq()
        client._queue(proto.Readback(seq, client._ref_of(self)), request=seq)
        _header, data = await client._connection.request(seq)
        if data is None:
            return np.zeros(self.shape, values_dtype(self.dtype))
        if self.base is not self and not self._whole:  # the bytes of the span it reaches over
            return picked(data, self)
        if isinstance(data, np.ndarray):  # assembled from several parts: already a private copy
            return from_storage(data, self.dtype).reshape(self.shape)
        return from_storage(np.frombuffer(data, np.uint8), self.dtype, copy=True).reshape(self.shape)

    def upload(self, array: Any) -> None:
        """Queue a host-to-device copy of `array` (same dtype and shape) into this tensor."""
        self._client.upload(self, array)

    def _view(self, shape: tuple[int, ...], strides: tuple[int, ...], offset: int) -> Tensor:
        """A view of this tensor's memory (no copy, no message, no daemon handle)."""
        self._client._ref_of(self)  # refuse a view of a freed tensor now, not at its first use
        base = self.base
        return Tensor(self._client, base.handle, self.dtype, shape, self.device, self.mode, base, offset, strides)

    @property
    def _whole(self) -> bool:
        """All of its base's memory, in order (the tensor itself, or a reshape of it)."""
        return not self.offset and self.is_contiguous and math.prod(self.shape) == math.prod(self.base.shape)

    def free(self) -> None:
        """Queue the free; the daemon releases the memory once work using it has completed. A view's
        free is the client's alone: the base, and its other views, stay."""
        if not self._freed:
            self._freed = True
            if self.base is self:
                client = self._client
                client._queue(proto.Free(client._next_seq(), self.handle))

    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray[Any, Any]:
        raise TypeError(f"{self!r} lives on the GPU: use `await tensor.numpy()` to read it")

    def __repr__(self) -> str:
        state = " freed" if self.freed else ""
        view = " (a view)" if self.base is not self else ""
        return f"<gpud Tensor #{self.handle}{view} {self.dtype}{list(self.shape)} device {self.device}{state}>"

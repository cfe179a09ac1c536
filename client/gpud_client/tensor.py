"""The device tensor: a handle to memory a session owns, or a view of it (gpud_client.views)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

import gpud_protocol as proto
from gpud_client.dtypes import HostDType, from_storage, name_of, values_dtype
from gpud_client.geometries import ViewOf, Wire, kept_geometries, kept_transposes, kept_views, strides_and_info, view_of
from gpud_client.operators import Operators
from gpud_client.packing import pack_fast
from gpud_client.pool import Origin, Pool
from gpud_client.reshapes import Reshapes
from gpud_client.scope import Scoped, current_task
from gpud_client.scope import made as scope_made
from gpud_client.values import TENSOR
from gpud_client.views import TensorViews, picked, reversed_axes
from gpud_protocol.ops import TensorInfo
from gpud_protocol.wire import pack

if TYPE_CHECKING:
    from gpud_client.liveness import Connection


class Owner(Scoped, Protocol):
    """What a tensor needs of the client it belongs to (gpud_client.client_base.ClientBase)."""

    _connection: Connection
    _pool: Pool

    def _next_seq(self) -> int: ...

    def _queue(self, op: proto.Op, request: int | None = None) -> None: ...

    def _ref_of(self, tensor: Tensor) -> int | proto.TensorView: ...

    def _release(self, handle: int, origin: Origin | None) -> None: ...

    def upload(self, tensor: Tensor, array: Any) -> None: ...


class Tensor(TensorViews, Reshapes, Operators):
    """A device tensor owned by a session (or opened from a resident name). Zero-filled when made.

    A view (`reshape`, `transpose`, `permute`, `narrow`: gpud_client.views) is a Tensor too: its `base`
    is the tensor whose memory it is, `handle` is the base's, and it travels as a `TensorView` (the
    base's handle with its own offset, shape and strides).

    An op-library call's output (no `out=`) is pooled when freed, or when Python drops it unfreed
    (gpud_client.pool): its handle serves the next output of its device, dtype and shape."""

    __slots__ = (
        "__weakref__",  # a user may hold weak references to tensors
        "_as_arg",
        "_base",
        "_client",
        "_freed",
        "_origin",  # an op output's: its memory goes to the client's pool when freed (else None)
        "_packed",
        "device",
        "dtype",
        "dtype_name",
        "handle",
        "info",
        "mode",
        "offset",
        "ref",
        "shape",
        "strides",
    )

    def __init__(
        self,
        client: Owner,
        handle: int,
        dtype: HostDType,
        shape: tuple[int, ...],
        device: int,
        mode: str = "rw",
        base: Tensor | None = None,
        offset: int = 0,
        strides: tuple[int, ...] | None = None,
        dtype_name: str | None = None,
        origin: Origin | None = None,
    ) -> None:
        self._client = client
        self._origin = origin
        self.handle = handle
        self.dtype = dtype
        self.dtype_name = name = name_of(dtype) if dtype_name is None else dtype_name  # "float32", "bfloat16"...
        self.shape = shape
        self.device = device
        self.mode = mode
        self._freed = False
        # A view's base tensor (`base`); None for a tensor of its own memory, which refers to nothing of its
        # own: dropped, it goes at once (a reference to itself would leave every one to the garbage collector).
        self._base = base
        self.offset = offset  # in elements, into the base's memory
        # its strides (in elements) and what the op library's rules see (gpud_protocol.ops); how the daemon
        # is told which tensor: the handle, or the base's handle with this view's geometry; that as a dispatch
        # argument (`_wire`), and packed (gpud_client.packing)
        self.ref: int | proto.TensorView
        self._as_arg: Wire
        if base is None:
            geometry = (name, shape, offset, strides)
            known = kept_geometries.get(geometry) or kept_geometries.keep(geometry, strides_and_info(geometry))
            self.strides, self.info = known
            self.ref = handle
            if origin is not None and origin.wire is not None:  # an op output's handle: packed when allocated
                self._as_arg, self._packed = origin.wire, origin.packed
            else:
                self._as_arg = wire = (TENSOR, handle)
                self._packed = pack_fast(wire)
        else:
            self.strides = strides = proto.contiguous_strides(shape) if strides is None else strides
            key = (handle, name, offset, shape, strides)
            self.info, self.ref, self._as_arg, self._packed = kept_views.get(key) or kept_views.keep(key, view_of(key))
        if client._scopes:  # a scope is open: the tensor is its
            scope_made(client, self)

    @property
    def _wire(self) -> Wire:
        """How the tensor travels as a dispatch argument: (TENSOR, ref)."""
        return self._as_arg

    @_wire.setter
    def _wire(self, wire: Wire) -> None:
        self._as_arg, self._packed = wire, pack(wire)

    @property
    def base(self) -> Tensor:
        """The tensor whose memory this is: itself, or a view's tensor."""
        return self if self._base is None else self._base

    graph = None  # a session's tensor belongs to no recording (gpud_client.operators)

    def _ops(self) -> Any:
        return self._client.ops  # type: ignore[attr-defined]  # gpud_client.Client's

    def __matmul__(self, other: Any) -> Any:
        """`Operators.__matmul__`; two session tensors (`q @ k.T` every step) go to the op without its lookups."""
        if type(other) is Tensor:
            return self._client.ops.matmul(self, other)  # type: ignore[attr-defined]
        return self._call2("matmul", self, other)

    @property
    def freed(self) -> bool:
        """Freed, or a view of a freed tensor: no longer usable."""
        return self._freed or (self._base is not None and self._base._freed)

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
        raw = np.frombuffer(data, np.uint8)  # a ring's reply is this reply's own, writable: no copy
        return from_storage(raw, self.dtype, copy=not raw.flags.writeable).reshape(self.shape)

    def upload(self, array: Any) -> None:
        """Queue a host-to-device copy of `array` (same dtype and shape) into this tensor."""
        self._client.upload(self, array)

    @property
    def T(self) -> Tensor:
        """Every axis reversed (numpy's `.T`; torch's for a 2-D tensor): a view (`TensorViews.T`, its geometry
        and reference kept by this tensor's in one memo: `q @ k.T` every step)."""
        base = self if self._base is None else self._base
        key = (base.handle, self.dtype_name, self.offset, self.shape, self.strides)
        known = kept_transposes.get(key)
        if known is None:
            shape, strides = reversed_axes(self.shape, self.strides)
            view = (base.handle, self.dtype_name, self.offset, shape, strides)
            of = kept_views.get(view) or kept_views.keep(view, view_of(view))
            known = kept_transposes.keep(key, (shape, strides, of))
        return self._view(known[0], known[1], self.offset, known[2])

    def _view(
        self, shape: tuple[int, ...], strides: tuple[int, ...], offset: int, known: ViewOf | None = None
    ) -> Tensor:
        """A view of this tensor's memory (no copy, no message, no daemon handle); `known`: what `kept_views`
        keeps of it, where the caller found it."""
        base = self if self._base is None else self._base
        if self._freed or base._freed:
            self._client._ref_of(self)  # refuse a view of a freed tensor now, not at its first use
        # Tensor(client, base.handle, dtype, shape, device, mode, base, offset, strides, dtype_name), without
        # its arguments' handling (`.T` and reshapes every step); tests/client/test_hot_path_memos.py compares them
        if known is None:
            key = (base.handle, self.dtype_name, offset, shape, strides)
            known = kept_views.get(key) or kept_views.keep(key, view_of(key))
        t: Tensor = _new_tensor(Tensor)
        t._client = client = self._client
        t._origin = None
        t.handle = base.handle
        t.dtype = self.dtype
        t.dtype_name = self.dtype_name
        t.shape = shape
        t.device = self.device
        t.mode = self.mode
        t._freed = False
        t._base = base
        t.offset = offset
        t.strides = strides
        t.info, t.ref, t._as_arg, t._packed = known
        scopes = client._scopes
        if scopes:  # `scope.made`, inlined (as in `output`)
            stack = scopes.get(current_task())
            if stack:
                stack[-1]._made[id(t)] = t
        return t

    @property
    def _whole(self) -> bool:
        """All of its base's memory, in order (the tensor itself, or a reshape of it)."""
        return not self.offset and self.is_contiguous and math.prod(self.shape) == math.prod(self.base.shape)

    def free(self) -> None:
        """Queue the free; the daemon releases the memory once work using it has completed. An op output's
        memory goes to the client's pool instead (gpud_client.pool), to serve a later output. A view's
        free is the client's alone: the base, and its other views, stay."""
        if not self._freed:
            self._freed = True
            if self._base is None:
                self._client._release(self.handle, self._origin)

    def __del__(self) -> None:
        if self._origin is not None and not self._freed:  # an op output dropped unfreed: pooled at the next call
            self._client._pool.dropped.append((self.handle, self._origin))

    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray[Any, Any]:
        raise TypeError(f"{self!r} lives on the GPU: use `await tensor.numpy()` to read it")

    def __repr__(self) -> str:
        state = " freed" if self.freed else ""
        view = " (a view)" if self.base is not self else ""
        return f"<gpud Tensor #{self.handle}{view} {self.dtype}{list(self.shape)} device {self.device}{state}>"


def output(
    client: Owner,
    handle: int,
    dtype: HostDType,
    shape: tuple[int, ...],
    device: int,
    name: str,
    origin: Origin,
    geometry: tuple[tuple[int, ...], TensorInfo],
) -> Tensor:
    """`Tensor(client, handle, dtype, shape, device, dtype_name=name, origin=origin)`, an op's output (every
    op makes one: `ClientBase._output`), from what its caller keeps: its `dense_geometry`, and `origin`'s
    packed handle. tests/client/test_hot_path_memos.py checks that it is `Tensor(...)` slot for slot."""
    t: Tensor = _new_tensor(Tensor)
    t._client = client
    t._origin = origin
    t.handle = handle
    t.dtype = dtype
    t.dtype_name = name
    t.shape = shape
    t.device = device
    t.mode = "rw"
    t._freed = False
    t._base = None
    t.offset = 0
    t.strides, t.info = geometry
    t.ref = handle
    if origin.wire is None:
        t._as_arg = wire = (TENSOR, handle)
        t._packed = pack_fast(wire)
    else:
        t._as_arg, t._packed = origin.wire, origin.packed
    scopes = client._scopes
    if scopes:  # `scope.made`, inlined: the tensor is the innermost scope's of this task, if one is open
        stack = scopes.get(current_task())
        if stack:
            stack[-1]._made[id(t)] = t
    return t


_new_tensor = object.__new__

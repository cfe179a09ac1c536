"""The client API: tensors, kernels, dispatches and requests.

    async with gpud_client.connect() as gpu:
        k = await gpu.kernel(wgsl_source, entry="main")
        x = gpu.tensor(np_array); y = gpu.empty((n,), "float32")
        gpu.dispatch(k, grid=(n // 64, 1, 1), args=[x, y, 2.0])   # queued, no round trip
        out = await y.numpy()                                      # flush + readback

Ops queue in the client and travel as one message when something is awaited. Only awaited calls
cost a round trip.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
from collections.abc import AsyncIterator, Sequence
from typing import Any, NamedTuple

import numpy as np

import gpud_protocol as proto
from gpud_client import residents as resident_calls
from gpud_client.batch import frame_budget
from gpud_client.connection import HANDSHAKE_TIMEOUT_S, Connection, Trace, default_address, open_connection
from gpud_client.dtypes import (
    HostDType,
    bfloat16,
    exact_bits,
    from_storage,
    host_dtype,
    is_bfloat16,
    to_bits,
    values_dtype,
)
from gpud_client.errors import GpudError, InvalidArgument
from gpud_client.graphs import Graph, Step
from gpud_client.loaders import load as loader
from gpud_client.ops import Ops
from gpud_client.residents import Resident
from gpud_client.scope import Scope
from gpud_client.scope import made as scope_made
from gpud_client.uploads import part_bytes, upload_in_parts
from gpud_client.views import TensorViews, dense_range, picked
from gpud_protocol import ArgKind, KernelOptions


class Scalar(NamedTuple):
    kind: int  # an ArgKind
    value: int | float


_TENSOR, _F32, _I32, _U32 = (int(k) for k in (ArgKind.TENSOR, ArgKind.F32, ArgKind.I32, ArgKind.U32))


def f32(value: float) -> Scalar:
    return Scalar(_F32, float(value))


def i32(value: int) -> Scalar:
    return Scalar(_I32, int(value))


def u32(value: int) -> Scalar:
    return Scalar(_U32, int(value))


class Kernel(NamedTuple):
    handle: int
    entry: str
    writes: tuple[int, ...] | None  # tensor-argument positions the kernel writes, as the daemon sees it
    unchecked: tuple[str, ...] = ()  # what the daemon could not check about this kernel


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
        self._wire = (_TENSOR, self.ref)  # as a dispatch argument
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


class Client:
    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self._seqs = itertools.count(1)
        self._handles = itertools.count(1)
        self._dispatches = proto.DispatchEncoder()
        self._kernels: dict[tuple[str, str, KernelOptions], Kernel] = {}
        self.ops = Ops(self)  # the built-in op library
        self._scopes: dict[Any, list[Scope]] = {}  # the open scopes of each task, innermost last

    # ------------------------------------------------------------------ info

    @property
    def address(self) -> str:
        return self._connection.address

    @property
    def welcome(self) -> dict[str, Any]:
        return self._connection.welcome

    @property
    def limits(self) -> proto.Limits:
        return self._connection.limits

    @property
    def backend(self) -> str:
        return str(self.welcome.get("backend", ""))

    @property
    def session_id(self) -> str:
        return str(self.welcome.get("session", ""))

    @property
    def devices(self) -> list[dict[str, Any]]:
        """What the daemon serves, one dict per device (index, name, memory...)."""
        return list(self.welcome.get("devices", []))

    @property
    def device(self) -> int:
        """This session's default device (chosen at connect, or the least loaded one)."""
        return int(self.welcome.get("device", 0))

    @property
    def last_trace(self) -> Trace | None:
        return self._connection.last_trace

    @property
    def _last_seq(self) -> int:
        """The sequence number of the op queued last (tests use it to check which op an error names)."""
        return self._seq_last

    # ------------------------------------------------------------------ tensors

    def tensor(self, array: Any, dtype: Any = None, *, device: int | None = None) -> Tensor:
        """Allocate a tensor holding a copy of `array` (the copy is taken now). dtype="bfloat16" rounds
        `array` to bfloat16, to nearest even (gpud_client.dtypes)."""
        if is_bfloat16(dtype):
            try:
                bits = to_bits(array, "tensor")
            except ValueError as exc:
                raise InvalidArgument(str(exc)) from None
            tensor = self.empty(bits.shape, bfloat16, device=device)
            self._send(tensor, bits)
            return tensor
        host = np.asarray(array, dtype=dtype, order="C")  # not ascontiguousarray: it makes 0-d arrays 1-d
        if host.dtype == object:
            raise InvalidArgument(f"cannot send an array of Python objects ({type(array).__name__})")
        tensor = self.empty(host.shape, host.dtype, device=device)
        self.upload(tensor, host)
        return tensor

    def empty(self, shape: int | Sequence[int], dtype: Any = "float32", *, device: int | None = None) -> Tensor:
        """A new tensor, zero-filled on every backend, on `device` (default: the session's)."""
        dims = (shape,) if isinstance(shape, int) else tuple(int(d) for d in shape)
        np_dtype = host_dtype(dtype)
        if np_dtype.name not in proto.DTYPE_SIZES:
            raise InvalidArgument(f"dtype {np_dtype} is not supported: use one of {sorted(proto.DTYPE_SIZES)}")
        where = self.device if device is None else int(device)
        if not 0 <= where < max(1, len(self.devices)):
            raise InvalidArgument(f"no device {where}: the daemon serves {len(self.devices)}")
        handle = next(self._handles)
        self._queue(proto.Alloc(self._next_seq(), handle, np_dtype.name, dims, where))
        return Tensor(self, handle, np_dtype, dims, where)

    zeros = empty

    def upload(self, tensor: Tensor, array: Any) -> None:
        host = np.asarray(array, order="C")
        if host.shape != tensor.shape or (host.dtype != tensor.dtype and tensor.dtype != bfloat16):
            raise InvalidArgument(f"array {host.dtype}{list(host.shape)} does not match {tensor!r}")
        if tensor.dtype == bfloat16:
            try:
                host = exact_bits(host, f"{tensor!r}")
            except ValueError as exc:
                raise InvalidArgument(str(exc), op="upload") from None
        self._send(tensor, host)

    def _send(self, tensor: Tensor, host: np.ndarray[Any, Any]) -> None:
        """Queue the upload of `host`, the tensor's bytes (bfloat16: their bits, uint16)."""
        dense_range(tensor, "upload")
        payload = host.tobytes()  # a snapshot: the caller may change `array` before the batch goes
        if len(payload) > frame_budget(self.limits):  # larger than a message: in parts
            upload_in_parts(self, tensor, payload, part_bytes(self.limits))
            return
        queue = self._connection.queue
        index = queue.add_frame(payload)
        if index is None:  # this payload goes with the next batch
            self._connection.send_batch()
            index = queue.add_frame(payload)
            assert index is not None
        self._queue(proto.Upload(self._next_seq(), self._ref_of(tensor), index, len(payload)))

    def copy(self, src: Tensor, dst: Tensor) -> None:
        """Queue a copy (same dtype and shape); the tensors may live on different devices. Views are
        copied where they are contiguous (call gpu.ops.contiguous on another first)."""
        dense_range(src, "copy")
        dense_range(dst, "copy")
        self._queue(proto.Copy(self._next_seq(), self._ref_of(src), self._ref_of(dst)))

    # ------------------------------------------------------------------ kernels

    async def kernel(
        self,
        source: str,
        entry: str = "main",
        *,
        block: Sequence[int] | None = None,
        flags: Sequence[str] = (),
        writes: Sequence[int] | None = None,
    ) -> Kernel:
        """Compile `source` (WGSL on webgpu, CUDA C on cuda); raises CompileError with the log.

        `block` is CUDA's block size (WGSL sets @workgroup_size in the source). `writes` lists the
        tensor-argument positions the kernel writes, when the daemon cannot infer them. The same
        source, entry and options give the same kernel, without a second round trip.
        """
        options = KernelOptions(
            None if block is None else _dim3(block),
            tuple(flags),
            None if writes is None else tuple(int(w) for w in writes),
        )
        key = (source, entry, options)
        if (known := self._kernels.get(key)) is not None:
            return known
        seq = self._next_seq()
        self._queue(proto.RegisterKernel(seq, next(self._handles), source, entry, options), request=seq)
        header, _ = await self._connection.request(seq)
        written = header.get("writes")
        kernel = Kernel(
            int(header["handle"]),
            entry,
            None if written is None else tuple(written),
            tuple(header.get("unchecked", ())),
        )
        self._kernels[key] = kernel
        return kernel

    def dispatch(
        self,
        kernel: Kernel,
        grid: int | Sequence[int],
        args: Sequence[Any] = (),
        *,
        writes: Sequence[int] | None = None,
    ) -> None:
        """Queue a dispatch: no round trip. Floats go as f32, ints as i32; use u32() for unsigned."""
        # The hot path: arguments become tuples of plain numbers, common types first.
        encoded = []
        for arg in args:
            kind = type(arg)
            if kind is Tensor and arg._client is self and not arg._freed and not arg.base._freed:
                encoded.append(arg._wire)
            elif kind is float:
                encoded.append((_F32, arg))
            elif kind is Scalar:
                encoded.append((arg[0], arg[1]))
            else:
                encoded.append(self._arg(arg))
        dims = (grid, 1, 1) if type(grid) is int else _dim3(grid)
        seq = next(self._seqs)
        self._seq_last = seq
        body = self._dispatches.encode(
            seq, kernel.handle, dims, tuple(encoded), None if writes is None else tuple(writes)
        )
        if self._connection.lost is not None:
            raise self._connection.lost
        if self._connection.queue.add(body):
            self._connection.send_batch()

    # ------------------------------------------------------------------ requests

    async def sync(self) -> None:
        """Wait until the device has finished all work this session queued."""
        await self._simple_request(proto.Sync)

    async def flush(self) -> None:
        """Send queued ops and return once the daemon executed them (no wait for the GPU)."""
        await self._simple_request(proto.FlushOp)

    async def stats(self) -> dict[str, Any]:
        header = await self._simple_request(proto.Stats)
        stats: dict[str, Any] = header["stats"]
        return stats

    async def _simple_request(self, op: type[Any]) -> dict[str, Any]:
        seq = self._next_seq()
        self._queue(op(seq), request=seq)
        header, _ = await self._connection.request(seq)
        return header

    # ------------------------------------------------------------------ resident tensors

    def publish(self, tensor: Tensor, name: str, mode: str = "ro") -> None:
        """Publish `tensor` under `name`; other sessions open it read-only ("ro") or read-write.
        A view is refused: publish its base (those who open it reshape it as they need)."""
        handle = self._handle_of(tensor)
        if tensor.base is not tensor:
            raise InvalidArgument(
                f"publish {name!r}: {tensor!r} is a view (reshaped, transposed or narrowed); publish its base tensor"
            )
        self._queue(proto.Publish(self._next_seq(), handle, name, mode))

    async def open(self, name: str) -> Tensor:
        """A handle to the resident tensor `name`, on the device where it lives."""
        handle = next(self._handles)
        seq = self._next_seq()
        self._queue(proto.Open(seq, handle, name), request=seq)
        header, _ = await self._connection.request(seq)
        return Tensor(
            self, handle, host_dtype(header["dtype"]), tuple(header["shape"]), int(header["device"]), header["mode"]
        )

    def unpublish(self, name: str) -> None:
        self._queue(proto.Unpublish(self._next_seq(), name))

    async def open_prefix(self, prefix: str) -> dict[str, Tensor]:
        """A handle to every resident tensor whose name starts with `prefix`, in one round trip:
        {name without the prefix: Tensor}, each in the mode its publisher chose, as `open` gives it.
        All or none: at most 1,024 (`gpud_protocol.RESIDENTS_PER_REPLY`) may match."""
        return await resident_calls.open_prefix(self, prefix)

    async def residents(self, prefix: str = "", *, after: str = "") -> list[Resident]:
        """The published tensors whose names start with `prefix` (name, dtype, shape, mode, nbytes,
        device), in name order, in one round trip: at most 1,024 of them, those after `after`
        if given (a full list may have more: ask again with `after=` its last name)."""
        return await resident_calls.residents(self, prefix, after)

    async def load_safetensors(
        self,
        path: str | os.PathLike[str],
        prefix: str = "",
        dtype: Any = None,
        mode: str = "ro",
        *,
        device: int | None = None,
        chunk_bytes: int = 16 << 20,
    ) -> dict[str, Tensor]:
        """Load a safetensors file into resident tensors named `prefix + name`, published in `mode`:
        {name: Tensor} (this session's handles). The file is memory-mapped and streamed in chunks of
        about `chunk_bytes`; it is checked as hostile input first. `dtype` ("float16", "float32",
        "float64") converts the floating-point tensors; integer tensors keep their dtype. BF16 tensors
        load as float32 (exactly), or as `dtype`: gpud has no bfloat16 dtype yet. On any failure
        nothing stays published or allocated, and the error names the tensor."""
        return await loader.load_safetensors(self, path, prefix, dtype, mode, device=device, chunk_bytes=chunk_bytes)

    def scope(self) -> Scope:
        """`async with gpu.scope() as scope:` frees, at exit, every tensor and view this client made
        inside, in this task, except those passed to `scope.keep(t)` (see gpud_client.scope)."""
        return Scope(self)

    # ------------------------------------------------------------------ replay graphs

    def graph(self, name: str) -> Graph:
        """A recorder of a step to build once and replay in one message (see gpud_client.graphs)."""
        return Graph(self, name)

    def publish_graph(self, step: Step, name: str) -> None:
        """Let every session open `step`'s graph (all its instances) by `name`."""
        self._queue(proto.PublishGraph(self._next_seq(), step.handle, name))

    async def open_graph(self, name: str) -> Step:
        """A published graph, to replay with this session's own inputs and bound tensors."""
        handle = next(self._handles)
        seq = self._next_seq()
        self._queue(proto.OpenGraph(seq, handle, name), request=seq)
        header, _ = await self._connection.request(seq)
        kinds = {1: "f32", 2: "i32", 3: "u32"}
        return Step(
            self,
            handle,
            name,
            int(header["device"]),
            [(n, d) for n, d in header["inputs"]],
            [(n, kinds[k]) for n, k in header["scalars"]],
            [(n, d) for n, d in header["binds"]],
            list(header["outputs"]),
        )

    def unpublish_graph(self, name: str) -> None:
        self._queue(proto.UnpublishGraph(self._next_seq(), name))

    # ------------------------------------------------------------------ plumbing

    def _next_seq(self) -> int:
        seq = self._seq_last = next(self._seqs)
        return seq

    def _handle_of(self, tensor: Tensor) -> int:
        """The handle of `tensor`'s memory (a view's base's), checked to be usable here."""
        if not isinstance(tensor, Tensor):
            raise InvalidArgument(f"expected a gpud Tensor, got {type(tensor).__name__}")
        if tensor._client is not self or tensor.freed:
            raise InvalidArgument(f"{tensor!r} is freed (or a view of a freed tensor) or belongs to another connection")
        return tensor.handle

    def _ref_of(self, tensor: Tensor) -> int | proto.TensorView:
        """How a tensor operand travels: its handle, or a view's `TensorView`."""
        self._handle_of(tensor)
        return tensor.ref

    def _arg(self, value: Any) -> tuple[int, int | float | proto.TensorView]:
        if isinstance(value, Tensor):
            return (_TENSOR, self._ref_of(value))
        if isinstance(value, Scalar):
            return (value.kind, value.value)
        if isinstance(value, bool):
            raise InvalidArgument("bool is not a kernel argument; pass i32(int(flag))")
        if isinstance(value, float | np.floating):
            return (_F32, float(value))
        if isinstance(value, np.unsignedinteger):
            return (_U32, int(value))
        if isinstance(value, int | np.integer):
            return (_I32, int(value))
        raise InvalidArgument(f"cannot pass {type(value).__name__} to a kernel")

    def _queue(self, op: proto.Op, request: int | None = None) -> None:
        connection = self._connection
        if connection.lost is not None:
            raise connection.lost
        if connection.queue.add(proto.encode_op(op), request):
            connection.send_batch()

    _seq_last = 0


def reshaped(old: tuple[int, ...], new: int | Sequence[Any]) -> tuple[int, ...]:
    """`new` (a shape, or a shape's dimensions as a sequence of one shape) with a -1 resolved, checked
    to hold as many elements as `old`."""
    if not isinstance(new, int) and len(new) == 1 and not isinstance(new[0], int):
        new = new[0]
    dims = [int(new)] if isinstance(new, int) else [int(d) for d in new]
    total = math.prod(old)
    if dims.count(-1) > 1 or any(d < -1 for d in dims):
        raise InvalidArgument(f"reshape to {dims}: dimensions are >= 0, with at most one -1")
    if -1 in dims:
        known = math.prod(d for d in dims if d != -1)
        if known == 0 or total % known:
            raise InvalidArgument(f"cannot reshape {list(old)} to {dims}")
        dims[dims.index(-1)] = total // known
    if math.prod(dims) != total:
        raise InvalidArgument(f"cannot reshape {list(old)} to {dims}: {total} elements, not {math.prod(dims)}")
    return tuple(dims)


def _dim3(value: int | Sequence[int]) -> tuple[int, int, int]:
    dims = (value,) if isinstance(value, int) else tuple(int(v) for v in value)
    if not 1 <= len(dims) <= 3:
        raise InvalidArgument(f"grid/block needs 1 to 3 dimensions, got {value!r}")
    padded = dims + (1,) * (3 - len(dims))
    return (padded[0], padded[1], padded[2])


@contextlib.asynccontextmanager
async def connect(
    address: str | None = None,
    *,
    timeout: float = HANDSHAKE_TIMEOUT_S,
    server_public_key: bytes | None = None,
    spin_us: float = 0.0,
    device: int | None = None,
) -> AsyncIterator[Client]:
    """Open a session with the daemon at `address` (default: GPUD_ADDRESS or the system socket).

    `device`: the session's default device (default: the daemon picks the least loaded one).
    `spin_us`: after sending a request, poll the socket this long before yielding to the event
    loop (lower round-trip latency, at the cost of CPU and of blocking the loop meanwhile).
    For tcp:// with CURVE, pass the daemon's public key (z85); the client makes a key pair of its own.
    """
    async with open_connection(
        address or default_address(),
        timeout=timeout,
        server_public_key=server_public_key,
        spin_us=spin_us,
        device=device,
    ) as connection:
        yield Client(connection)


__all__ = ["Client", "GpudError", "Graph", "Kernel", "Scalar", "Step", "Tensor", "connect", "f32", "i32", "u32"]

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
import os
from collections.abc import AsyncIterator, Sequence
from typing import Any

import numpy as np

import gpud_protocol as proto
from gpud_client import residents as resident_calls
from gpud_client.batch import frame_budget
from gpud_client.client_base import ClientBase
from gpud_client.client_graphs import GraphCalls
from gpud_client.dtypes import bfloat16, exact_bits, host_dtype, is_bfloat16, name_of, to_bits
from gpud_client.errors import InvalidArgument
from gpud_client.liveness import Connection, open_connection
from gpud_client.loaders import load as loader
from gpud_client.ops import Ops
from gpud_client.residents import Resident
from gpud_client.scope import Scope
from gpud_client.tensor import Tensor
from gpud_client.transport import HANDSHAKE_TIMEOUT_S, default_address, spin_from_environment
from gpud_client.uploads import part_bytes, upload_in_parts
from gpud_client.values import F32, Kernel, Scalar, dim3
from gpud_client.views import dense_range
from gpud_protocol import KernelOptions


class Client(GraphCalls, ClientBase):
    def __init__(self, connection: Connection) -> None:
        super().__init__(connection)
        self._kernels: dict[tuple[str, str, KernelOptions], Kernel] = {}
        self.ops = Ops(self)  # the built-in op library

    # ------------------------------------------------------------------ tensors

    def tensor(self, array: Any, dtype: Any = None, *, device: int | None = None) -> Tensor:
        """Allocate a tensor holding a copy of `array` (the copy is taken now). dtype="bfloat16" rounds
        `array` to bfloat16, to nearest even (gpud_client.dtypes). The upload writes every byte, so the
        memory may be a freed op output's of the same dtype and shape (gpud_client.pool)."""
        if is_bfloat16(dtype):
            try:
                bits = to_bits(array, "tensor")
            except ValueError as exc:
                raise InvalidArgument(str(exc)) from None
            tensor = self._output(*self._checked(bits.shape, bfloat16, device))
            self._send(tensor, bits)
            return tensor
        host = np.asarray(array, dtype=dtype, order="C")  # not ascontiguousarray: it makes 0-d arrays 1-d
        if host.dtype == object:
            raise InvalidArgument(f"cannot send an array of Python objects ({type(array).__name__})")
        tensor = self._output(*self._checked(host.shape, host.dtype, device))
        self.upload(tensor, host)
        return tensor

    def empty(self, shape: int | Sequence[int], dtype: Any = "float32", *, device: int | None = None) -> Tensor:
        """A new tensor, zero-filled on every backend, on `device` (default: the session's)."""
        dims, name, where = self._checked(shape, dtype, device)
        return self._new(dims, name, where, host_dtype(dtype))

    def _checked(self, shape: int | Sequence[int], dtype: Any, device: int | None) -> tuple[tuple[int, ...], str, int]:
        """(shape, dtype name, device) of a new tensor, checked."""
        dims = (shape,) if isinstance(shape, int) else tuple(int(d) for d in shape)
        name = name_of(host_dtype(dtype))  # np_dtype.name, kept (numpy takes microseconds for it)
        if name not in proto.DTYPE_SIZES:
            raise InvalidArgument(f"dtype {host_dtype(dtype)} is not supported: use one of {sorted(proto.DTYPE_SIZES)}")
        where = self.device if device is None else int(device)
        # A process-per-device worker serves one device of several: it judges the others' indices itself.
        if not 0 <= where < max(1, len(self.devices)) and not self.welcome.get("process_per_device"):
            raise InvalidArgument(f"no device {where}: the daemon serves {len(self.devices)}")
        return dims, name, where

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
        shared: int = 0,
    ) -> Kernel:
        """Compile `source` (WGSL on webgpu, CUDA C on cuda); raises CompileError with the log.

        `block` is CUDA's block size (WGSL sets @workgroup_size in the source); `shared` the bytes of
        CUDA dynamic shared memory (`extern __shared__`) each block gets. `writes` lists the
        tensor-argument positions the kernel writes, when the daemon cannot infer them. The same
        source, entry and options give the same kernel, without a second round trip.
        """
        options = KernelOptions(
            None if block is None else dim3(block),
            tuple(flags),
            None if writes is None else tuple(int(w) for w in writes),
            int(shared),
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
            if kind is Tensor and arg._client is self and not arg._freed and not (arg._base and arg._base._freed):
                encoded.append(arg._as_arg)
            elif kind is float:
                encoded.append((F32, arg))
            elif kind is Scalar:
                encoded.append((arg[0], arg[1]))
            else:
                encoded.append(self._arg(arg))
        dims = (grid, 1, 1) if type(grid) is int else dim3(grid)
        seq = next(self._seqs)
        self._seq_last = seq
        body = self._dispatches.encode(
            seq, kernel.handle, dims, tuple(encoded), None if writes is None else tuple(writes)
        )
        if self._connection.lost is not None:
            raise self._connection.lost
        if self._connection.queue.add(body):
            self._connection.send_batch()

    # ------------------------------------------------------------------ resident tensors

    def publish(self, tensor: Tensor, name: str, mode: str = "ro") -> None:
        """Publish `tensor` under `name`; other sessions open it read-only ("ro") or read-write.
        A view is refused: publish its base (those who open it reshape it as they need)."""
        handle = self._handle_of(tensor)
        if tensor.base is not tensor:
            raise InvalidArgument(
                f"publish {name!r}: {tensor!r} is a view (reshaped, transposed or narrowed); publish its base tensor"
            )
        self._hold(tensor)  # the name keeps the memory: never reused as another op's output
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
        "float64", "bfloat16") converts the floating-point tensors; integer tensors keep their dtype.
        BF16 tensors load as bfloat16 (their bits unchanged), or as `dtype`. On any failure
        nothing stays published or allocated, and the error names the tensor."""
        return await loader.load_safetensors(self, path, prefix, dtype, mode, device=device, chunk_bytes=chunk_bytes)

    def scope(self) -> Scope:
        """`async with gpu.scope() as scope:` frees, at exit, every tensor and view this client made
        inside, in this task, except those passed to `scope.keep(t)` (see gpud_client.scope).

        The op library's outputs it frees go to the client's pool, to serve the next outputs of their
        device, dtype and shape without an allocation: that memory still counts in the session's memory
        as the daemon reports it (`stats()`) and against its quota, up to a quarter of the quota (at
        least 1 GiB; `set_pool_limits`). `trim()` frees it; the client trims by itself before raising an OutOfMemory."""
        return Scope(self)


@contextlib.asynccontextmanager
async def connect(
    address: str | None = None,
    *,
    timeout: float = HANDSHAKE_TIMEOUT_S,
    server_public_key: bytes | None = None,
    spin_us: float = 0.0,
    device: int | None = None,
    ring: bool | None = None,
) -> AsyncIterator[Client]:
    """Open a session with the daemon at `address` (default: GPUD_ADDRESS or the system socket).

    `device`: the session's default device (default: the daemon picks the least loaded one).
    `spin_us`: after sending a request, poll the socket this long before yielding to the event
    loop (lower round-trip latency, at the cost of CPU and of blocking the loop meanwhile; default:
    GPUD_SPIN_US in the environment, else 0).
    `ring`: the same-host fast path (default: GPUD_RING=1 in the environment): batches and small
    replies travel through a shared-memory ring beside the socket, and each request polls for its
    reply for `spin_us` (1,000 where neither it nor GPUD_SPIN_US is given) before it sleeps. ipc:// on
    x86-64 only; elsewhere, or with a daemon that offers none, the session goes on over ZeroMQ alone
    (`gpu.ring` says which).
    For tcp:// with CURVE, pass the daemon's public key (z85); the client makes a key pair of its own.
    """
    if ring is None:
        ring = os.environ.get("GPUD_RING", "") == "1"
    if not spin_us:
        spin_us = spin_from_environment()
    async with open_connection(
        address or default_address(),
        timeout=timeout,
        server_public_key=server_public_key,
        spin_us=spin_us,
        device=device,
        ring=ring,
    ) as connection:
        yield Client(connection)
